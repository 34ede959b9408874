"""What the proxy costs, measured side by side in one run.

1. Prompt building at each turn of a 30-turn tool conversation of realistic size (~40 KB of tool
   JSON, ~2 KB tool results): the append-only bridge (hash the history, render and tokenize only
   the new messages) vs `apply_chat_template` + tokenize over the whole history.
2. Per-call latency and server CPU: the OpenAI SDK streaming the same 30-turn conversation
   through (a) the proxy in front of a zero-cost engine and (b) a bare HTTP server that streams
   the same fixed answer without parsing anything (the floor any server pays). Both servers run
   in their own processes so their CPU time is measured alone. Then 16 conversations at once.

    python benchmarks/proxy_overhead.py [--turns 30] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ANSWER = '<tool_call>\n{"name": "bash", "arguments": {"command": "pytest -x tests/"}}\n</tool_call>'


def make_tools(target_bytes: int = 40_000) -> list[dict]:
    tools = []
    i = 0
    while len(json.dumps(tools)) < target_bytes:
        props = {
            f"arg_{j}": {"type": "string", "description": f"Parameter {j} of tool {i}. " * 6}
            for j in range(6)
        }
        tools.append({"type": "function", "function": {
            "name": "bash" if i == 0 else f"tool_{i}",
            "description": ("Runs an operation on the repository and reports the result. " * 8),
            "parameters": {"type": "object", "properties": props, "required": ["arg_0"]},
        }})
        i += 1
    return tools


def tool_result(turn: int) -> str:
    lines = [f"tests/test_mod_{turn}.py::test_case_{k} PASSED [{k}%]" for k in range(40)]
    return "\n".join(lines)[:2000]


# --- 1. prompt building -----------------------------------------------------------------


def timed(fn, repeat: int):
    """(result, median milliseconds over `repeat` runs)."""
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return result, statistics.median(times)


def bench_prompt_building(turns: int) -> dict:
    from harness_gym.engines import load_tiny_tokenizer
    from harness_gym.engines.base import Completion
    from harness_gym.proxy.bridge import PromptBridge
    from harness_gym.proxy.canonical import AssistantTurn, ChatRequest, Message, ToolCall, ToolSpec
    from harness_gym.proxy.rendering import PromptRenderer
    from harness_gym.trace import SessionTrace

    tokenizer = load_tiny_tokenizer()
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    renderer = PromptRenderer(tokenizer, [stop])
    bridge = PromptBridge(renderer, SessionTrace())
    tools_json = make_tools()
    tools = tuple(ToolSpec(t["function"]["name"], t["function"]["description"],
                           t["function"]["parameters"]) for t in tools_json)
    messages = [Message("system", "You are a coding agent. " * 40),
                Message("user", "Fix the failing test in the parser module.")]
    answer_ids = tokenizer.encode(ANSWER, add_special_tokens=False) + [stop]
    bridged_ms, full_ms = [], []
    for turn in range(turns):
        request = ChatRequest(tuple(messages), tools)
        plan, bridged = timed(lambda: bridge.plan(request), repeat=7)  # plan() is read-only
        full, full_ms_turn = timed(lambda: tokenizer.apply_chat_template(
            [m.template_dict() for m in messages], tools=tools_json, add_generation_prompt=True,
            tokenize=True, return_dict=False), repeat=3)
        if plan.prompt_ids != list(full):
            raise AssertionError(f"turn {turn}: bridged prompt differs from a full render")
        bridged_ms.append(bridged)
        full_ms.append(full_ms_turn)
        call = ToolCall(f"call_{turn}", "bash", {"command": "pytest -x tests/"})
        bridge.commit(plan, Completion(answer_ids, [0.0] * len(answer_ids), "stop"),
                      AssistantTurn("", (call,), "tool_calls"), 0.0)
        messages += [Message("assistant", "", (call,)),
                     Message("tool", tool_result(turn), tool_call_id=f"call_{turn}")]
    return {"bridged_ms": bridged_ms, "full_ms": full_ms,
            "prompt_tokens": len(plan.prompt_ids),
            "request_kb": len(json.dumps([m.template_dict() for m in messages]) +
                              json.dumps(tools_json)) / 1024}


# --- 2. latency through HTTP ----------------------------------------------------------------

PROXY_SERVER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {root!r})
    from bench_zero_engine import ZeroCostEngine
    from harness_gym.proxy import InterceptionProxy
    proxy = InterceptionProxy(ZeroCostEngine({answer!r})).start()
    keys = [proxy.open_session().session_id for _ in range(64)]
    print(proxy.base_url, ",".join(keys), flush=True)
    time.sleep(10**6)
""")

BARE_SERVER = textwrap.dedent("""
    import socket, sys, time, orjson, uvicorn
    from starlette.applications import Starlette
    from starlette.responses import StreamingResponse
    from starlette.routing import Route
    ANSWER = {answer!r}
    def chunk(delta, finish=None):
        return b"data: " + orjson.dumps({{"id": "x", "object": "chat.completion.chunk",
            "created": 0, "model": "m", "choices": [{{"index": 0, "delta": delta,
            "logprobs": None, "finish_reason": finish}}]}}) + b"\\n\\n"
    BODY = [chunk({{"role": "assistant", "content": ""}}),
            chunk({{"tool_calls": [{{"index": 0, "id": "call_1", "type": "function",
                "function": {{"name": "bash", "arguments": '{{"command":"pytest -x tests/"}}'}}}}]}}),
            chunk({{}}, "tool_calls"), b"data: [DONE]\\n\\n"]
    async def chat(request):
        await request.body()  # the floor: read the request, parse nothing
        async def gen():
            for part in BODY:
                yield part
        return StreamingResponse(gen(), media_type="text/event-stream")
    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    sock = socket.socket(); sock.bind(("127.0.0.1", 0)); sock.listen(2048)
    print(f"http://127.0.0.1:{{sock.getsockname()[1]}}/v1", ",".join(["k"] * 64), flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False)).run(sockets=[sock])
""")

ZERO_ENGINE = textwrap.dedent('''
    """A zero-cost engine for benchmarks: the tiny tokenizer's ids of a fixed answer, at once."""
    from harness_gym.engines import Engine, TokenChunk, load_tiny_tokenizer

    class ZeroCostEngine(Engine):
        model_name = "zero"
        max_context = 1 << 20

        def __init__(self, answer):
            self._tokenizer = load_tiny_tokenizer()
            stop = self._tokenizer.convert_tokens_to_ids("<|im_end|>")
            self.stop_token_ids = (stop,)
            self.ids = self._tokenizer.encode(answer, add_special_tokens=False) + [stop]

        @property
        def tokenizer(self):
            return self._tokenizer

        async def _gen(self):
            yield TokenChunk(list(self.ids), [0.0] * len(self.ids), "stop")

        def stream(self, prompt_ids, sampling, context=None):
            return self._gen()
''')


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_server(code: str, workdir: Path) -> tuple[subprocess.Popen, str, list[str]]:
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                               cwd=workdir, env={**os.environ, "PYTHONPATH": str(workdir)})
    url, keys = process.stdout.readline().split()
    return process, url, keys.split(",")


def conversation(client, tools: list[dict], turns: int, latencies: list[float]) -> None:
    messages = [{"role": "system", "content": "You are a coding agent. " * 40},
                {"role": "user", "content": "Fix the failing test in the parser module."}]
    for turn in range(turns):
        t0 = time.perf_counter()
        calls = []
        for chunk in client.chat.completions.create(model="m", messages=messages, tools=tools,
                                                    stream=True):
            if chunk.choices and chunk.choices[0].delta.tool_calls:
                calls += chunk.choices[0].delta.tool_calls
        latencies.append((time.perf_counter() - t0) * 1e3)
        call = calls[0]
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function", "function": {
                "name": call.function.name, "arguments": call.function.arguments}}]})
        messages.append({"role": "tool", "tool_call_id": call.id, "content": tool_result(turn)})


def bench_http(code: str, workdir: Path, turns: int, concurrency: int) -> dict:
    import openai

    process, url, keys = start_server(code, workdir)
    try:
        tools = make_tools()
        client = openai.OpenAI(base_url=url, api_key=keys[0], max_retries=0)
        conversation(client, tools, 3, [])  # warm-up
        latencies: list[float] = []
        conversation(openai.OpenAI(base_url=url, api_key=keys[1], max_retries=0), tools, turns,
                     latencies)
        # Server CPU is read from /proc in clock ticks (10 ms): count it over the many calls
        # of the concurrent phase, not the 30 sequential ones.
        threads, sink = [], []
        cpu0 = cpu_seconds(process.pid)
        t0 = time.perf_counter()
        for i in range(concurrency):
            c = openai.OpenAI(base_url=url, api_key=keys[2 + i], max_retries=0)
            threads.append(threading.Thread(target=conversation, args=(c, tools, turns, sink)))
            threads[-1].start()
        for t in threads:
            t.join()
        throughput = len(sink) / (time.perf_counter() - t0)
        cpu_per_call = (cpu_seconds(process.pid) - cpu0) / len(sink) * 1e3
        return {"p50_ms": statistics.median(latencies), "last_ms": latencies[-1],
                "cpu_ms_per_call": cpu_per_call, "calls_per_s": throughput}
    finally:
        process.kill()
        process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()

    build = bench_prompt_building(args.turns)
    last = args.turns - 1
    print(f"prompt building, {args.turns}-turn tool conversation "
          f"(request {build['request_kb']:.0f} KB, {build['prompt_tokens']} tokens at the end):")
    for turn in sorted({0, 9, 19, last}):
        b, f = build["bridged_ms"][turn], build["full_ms"][turn]
        print(f"  turn {turn + 1:>2}: bridged {b:7.3f} ms   full re-render {f:8.3f} ms   "
              f"ratio {f / b:6.1f}x")
    ratio = build["full_ms"][last] / build["bridged_ms"][last]

    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        (workdir / "bench_zero_engine.py").write_text(ZERO_ENGINE)
        proxy = bench_http(PROXY_SERVER.format(root=str(ROOT), answer=ANSWER), workdir,
                           args.turns, args.concurrency)
        bare = bench_http(BARE_SERVER.format(answer=ANSWER), workdir, args.turns,
                          args.concurrency)
    overhead = proxy["p50_ms"] - bare["p50_ms"]
    print(f"\nHTTP, openai SDK streaming, {args.turns} turns, zero-cost engine:")
    for name, r in (("bare server", bare), ("proxy", proxy)):
        print(f"  {name:<12} p50 {r['p50_ms']:6.2f} ms  turn {args.turns} {r['last_ms']:6.2f} ms  "
              f"server CPU {r['cpu_ms_per_call']:5.2f} ms/call  "
              f"{args.concurrency} concurrent: {r['calls_per_s']:6.1f} calls/s")
    print(f"\nsummary: bridged prompt build {ratio:.1f}x faster than a full re-render at turn "
          f"{args.turns} (target >= 20x); proxy adds {overhead:.2f} ms p50 per call over the bare "
          f"server (target < 2 ms); throughput ratio proxy/bare "
          f"{proxy['calls_per_s'] / bare['calls_per_s']:.2f}")


if __name__ == "__main__":
    main()
