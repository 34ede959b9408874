"""The agent: OpenAI Chat Completions over plain HTTP, one `bash` tool, a loop until the model
answers without a tool call. Usage: python -m tiny_agent.cli PROMPT (config from env vars
TINY_AGENT_BASE_URL, TINY_AGENT_API_KEY, TINY_AGENT_MODEL)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request

BASH = {"type": "function", "function": {
    "name": "bash", "description": "Run a shell command in the repository.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                   "required": ["command"]}}}


def chat(messages: list[dict]) -> dict:
    body = json.dumps({"model": os.environ["TINY_AGENT_MODEL"], "messages": messages,
                       "tools": [BASH]}).encode()
    request = urllib.request.Request(
        os.environ["TINY_AGENT_BASE_URL"].rstrip("/") + "/chat/completions", data=body,
        headers={"content-type": "application/json",
                 "authorization": "Bearer " + os.environ["TINY_AGENT_API_KEY"]})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.load(response)["choices"][0]["message"]


def main() -> int:
    messages = [{"role": "system", "content": "You are a coding agent. Use bash."},
                {"role": "user", "content": sys.argv[1]}]
    for _ in range(int(os.environ.get("TINY_AGENT_MAX_TURNS", "8"))):
        message = chat(messages)
        messages.append({k: v for k, v in message.items() if k in ("role", "content", "tool_calls")})
        calls = message.get("tool_calls") or []
        if not calls:
            print(json.dumps({"type": "final", "text": message.get("content") or "",
                              "tool_calls": sum(1 for m in messages if m.get("tool_calls"))}))
            return 0
        for call in calls:
            command = json.loads(call["function"]["arguments"]).get("command", "")
            done = subprocess.run(["bash", "-c", command], capture_output=True, text=True)
            messages.append({"role": "tool", "tool_call_id": call["id"],
                             "content": (done.stdout + done.stderr)[-4000:] or "(no output)"})
    print(json.dumps({"type": "final", "text": "turn limit reached"}))
    return 1


if __name__ == "__main__":
    sys.exit(main())
