"""aider, for real: it has no tools, so the oracle answers its udiff request with the gold patch as
```diff blocks, which aider applies itself. It solves a built-in task through our proxy on bwrap
and fails it with `oracle:noop`; against a logging server it sends the task text as written, the
output cap, streaming, and nothing but chat completions; plus its config as data.

The CLI runs under `unshare --net` where that is possible (root), so it can have reached nothing
but loopback (`test_harness_episodes.isolated_network`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

import pytest
import yaml
from support.parallel import in_threads
from test_harness_episodes import TASKS, changed_lines, isolated_network
from test_harness_more_clis import TASK

from harness_gym.engines.oracle import UDIFF_REQUEST, udiff_blocks
from harness_gym.harness import Endpoint, load_harness
from harness_gym.harnesses.aider import (EDIT_FORMAT, METADATA_FILE, SETTINGS_FILE,
                                         AiderHarness)

ENDPOINT = Endpoint("http://127.0.0.1:9", "key", model='pol"icy', context_length=32_768,
                    max_tokens=2_048)
# Starts like a command ("/" is one to aider), a flag and a file mention; odd whitespace.
HOSTILE_TASK = "/users/<int:id> -x @f !bang\r\n" + "é\u2028 \t" * 50 + "\n  trailing  \n"


def test_aider_is_registered_without_tools_and_configured_as_data() -> None:
    harness = load_harness("aider")
    assert isinstance(harness, AiderHarness)
    assert (harness.dialect, harness.edit_format) == ("openai-chat", "udiff")
    files = harness.config_files(ENDPOINT)
    metadata = json.loads(files[METADATA_FILE])['openai/pol"icy']
    assert (metadata["max_input_tokens"], metadata["max_output_tokens"]) == (30_720, 2_048)
    (settings,) = yaml.safe_load(files[SETTINGS_FILE])  # JSON, read as aider reads it: YAML
    assert settings["name"] == 'openai/pol"icy' and settings["edit_format"] == EDIT_FORMAT
    assert settings["extra_params"] == {"max_tokens": 2_048}
    args = harness.args(ENDPOINT, HOSTILE_TASK)
    assert HOSTILE_TASK not in args and harness.stdin(HOSTILE_TASK) == HOSTILE_TASK
    for switch in ("--no-check-update", "--analytics-disable", "--no-git", "--yes-always",
                   "--no-auto-commits", "--no-auto-lint", "--no-auto-test", "--no-detect-urls"):
        assert switch in args
    assert args[args.index("--model") + 1] == 'openai/pol"icy'
    assert harness.endpoint_env(ENDPOINT) == {"OPENAI_API_BASE": "http://127.0.0.1:9/v1",
                                              "OPENAI_API_KEY": "key"}
    assert harness.env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"


def test_the_oracle_writes_a_git_patch_as_one_diff_block_per_file() -> None:
    patch = (
        "diff --git a/a.py b/a.py\nindex 1..2 100644\n--- a/a.py\n+++ b/a.py\n@@ -1 +1 @@\n"
        "-x = 1\n+x = 2\n"
        "diff --git a/new.py b/new.py\nnew file mode 100644\nindex 0..3\n--- /dev/null\n"
        "+++ b/new.py\n@@ -0,0 +1 @@\n+y = 3\n"
    )
    assert udiff_blocks(patch) == (
        "```diff\n--- a/a.py\n+++ b/a.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n```\n"
        "```diff\n--- /dev/null\n+++ b/new.py\n@@ -0,0 +1 @@\n+y = 3\n```\n"
    )


# A logging OpenAI-chat server on loopback port 0 that answers "ok" (streamed or not), and aider
# run once against it the way `prepare` starts it, in a throwaway HOME and workdir.
PROBE = textwrap.dedent("""
    import json, os, subprocess, sys, tempfile, threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from harness_gym.harness import Endpoint, load_harness

    seen = []
    class Logger(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append([self.command, self.path, body])
            delta = {"role": "assistant", "content": "ok"}
            if body.get("stream"):
                chunks = [{"choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
                          {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}]
                data = "".join("data: " + json.dumps({"id": "x", "object":
                               "chat.completion.chunk", "created": 0, "model": "m", **c})
                               + "\\n\\n" for c in chunks) + "data: [DONE]\\n\\n"
                kind = "text/event-stream"
            else:
                data = json.dumps({"id": "x", "object": "chat.completion", "created": 0,
                                   "model": "m", "choices": [{"index": 0, "message": delta,
                                   "finish_reason": "stop"}]})
                kind = "application/json"
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data.encode())))
            self.end_headers()
            self.wfile.write(data.encode())
        def do_GET(self):
            seen.append([self.command, self.path, None])
            self.send_response(404)
            self.end_headers()
        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Logger)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    harness, prompt = load_harness("aider"), sys.argv[1]
    endpoint = Endpoint(f"http://127.0.0.1:{server.server_port}", "k", "policy", 32768, 2048)
    home, work = tempfile.mkdtemp(), tempfile.mkdtemp()
    for rel, content in harness.config_files(endpoint).items():
        with open(os.path.join(home, rel), "w") as f:
            f.write(content)
    env = {"PATH": "/usr/bin:/bin", "HOME": home, **harness.env, **harness.endpoint_env(endpoint)}
    done = subprocess.run([str(harness.executable()), *harness.args(endpoint, prompt)], cwd=work,
                          env=env, input=harness.stdin(prompt), capture_output=True, text=True,
                          timeout=240)
    server.shutdown()
    print("RESULT " + json.dumps({"rc": done.returncode, "stdout": done.stdout[-2000:],
                                  "stderr": done.stderr[-2000:], "seen": seen,
                                  "workdir": os.listdir(work)}))
""")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_aider_sends_the_task_as_written_with_the_cap_and_nothing_else() -> None:
    harness = load_harness("aider")
    harness.install()
    from harness_gym.harness_check import check_harness

    prefix = isolated_network()

    def probe() -> subprocess.CompletedProcess[str]:
        return subprocess.run([*(prefix or []), sys.executable, "-c", PROBE, HOSTILE_TASK],
                              capture_output=True, text=True, timeout=300)

    # The probe and `harnesses --check` side by side (`support.parallel`): each its own aider
    # process, the probe's server and the check's proxy and sandbox its own.
    done, problems = in_threads(lambda share: [job() for job in share],
                                [probe, lambda: check_harness(harness)], 2)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, done.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT "):])
    assert result["rc"] == 0, (result["stdout"], result["stderr"])
    (request,) = result["seen"]  # one model call, and no other request at all
    method, path, body = request
    assert (method, path) == ("POST", "/v1/chat/completions")
    assert (body["model"], body["max_tokens"], body["stream"]) == ("policy", 2_048, True)
    assert UDIFF_REQUEST in body["messages"][0]["content"]  # what the oracle answers to
    # The task text is the last user message, byte for byte ("/users..." was not taken for an
    # aider command); aider's edit-format reminder follows it as a system message.
    *_, task, reminder = body["messages"]
    assert task == {"role": "user", "content": HOSTILE_TASK}
    assert reminder["role"] == "system" and "unified diff" in reminder["content"]
    assert result["workdir"] == []  # no history files left in the repo
    assert problems == []  # `harnesses --check`: the probe's CRLF kept, the cap
    if prefix is None:
        pytest.skip("aider behaved, but on the host network: unshare --net needs root")


@pytest.fixture(scope="module")
def bwrap_episodes() -> tuple[dict[str, dict], bool]:
    """engine -> info of the oracle, `oracle:noop` and teacher episodes on the task, on bwrap:
    one driver process (`test_harness_episodes.EPISODES`, under `unshare --net` where it can)
    runs the three side by side, instead of one driver for the oracle and noop and another
    for the teacher; and whether the driver was offline."""
    from test_harness_episodes import EPISODES

    if shutil.which("bwrap") is None:
        pytest.skip("needs bubblewrap")
    load_harness("aider").install()
    script = EPISODES.replace('sandbox="local"', 'sandbox="bwrap"').replace(
        '(("oracle", task_ids), ("oracle:noop", task_ids[:1]))',
        '(("oracle", task_ids), ("oracle:noop", task_ids[:1]), ("teacher", task_ids))')
    assert '"teacher"' in script and 'sandbox="bwrap"' in script
    prefix = isolated_network()
    done = subprocess.run([*(prefix or []), sys.executable, "-c", script, "aider", TASK],
                          capture_output=True, text=True, timeout=900)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-4000:]
    infos = json.loads(lines[-1][len("RESULT "):])
    by_engine = {info["engine"]: info for info in infos}
    assert sorted(by_engine) == ["oracle", "oracle:noop", "teacher"] and len(infos) == 3
    return by_engine, prefix is not None


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_aider_solves_a_builtin_task_on_bwrap_with_the_oracle_and_fails_with_noop(
        bwrap_episodes) -> None:
    infos, offline = bwrap_episodes
    solved, failed = infos["oracle"], infos["oracle:noop"]
    assert solved["outcome"] == "passed", (solved["error"], solved["harness_output"]["tail"])
    task = TASKS[TASK]
    assert all(solved["tests"][t] == "PASSED" for t in task.FAIL_TO_PASS)
    assert changed_lines(solved["patch"]) == changed_lines(task.patch)  # nothing else written
    assert "Applied edit to routes/router.py" in solved["harness_output"]["tail"]
    assert solved["n_llm_calls"] == 1 and solved["n_tool_calls"] == 0  # an edit block, no tools
    assert [s["role"] for s in solved["trace"]] == ["agent"]
    assert failed["outcome"] == "failed" and failed["reward"] == 0.0
    if not offline:
        pytest.skip("episodes passed, but on the host network: unshare --net needs root")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_teacher_solves_a_builtin_task_through_aider_on_bwrap(bwrap_episodes) -> None:
    """The teacher answers aider's udiff request with the gold hunks under `@@ ... @@` headers
    (no line numbers): aider applies them and the tests pass."""
    infos, _ = bwrap_episodes
    taught = infos["teacher"]
    assert taught["outcome"] == "passed", (taught["error"], taught["harness_output"]["tail"])
    assert changed_lines(taught["patch"]) == changed_lines(TASKS[TASK].patch)
    assert taught["n_llm_calls"] == 1 and taught["n_tool_calls"] == 0
    assert "Applied edit to routes/router.py" in taught["harness_output"]["tail"]
