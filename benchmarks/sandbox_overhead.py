"""What a sandbox and the grader cost, side by side in one run.

Figures are best-of-N (the least disturbed by other load); grading rows interleave the direct
run and every backend so that load hits them alike.

1. Sandbox lifecycle: `create` (a materialized task repo copied in) + one `exec` of `true` +
   `kill_processes` (the step between the agent's turn and grading) + `close`, per installed
   backend (`local`, `bwrap`; `docker` when a daemon answers; any backend that cannot start
   here is listed as skipped, with why).
2. Grading: `grade()` of a gold-patched built-in task through each backend vs the same pytest
   command run directly, in a sandbox of the same backend whose checkout already holds the gold
   and test patches (the floor: what running the tests there costs with no grader at all). The
   hardened grader also captures the patch, restores the test scope, applies the test patch,
   runs pytest with its reporter plugin and tamper checks, and reads the report back: four
   sandbox commands (five with the base-commit probe) around the test run.
3. The proxy path of a `bwrap` sandbox: per-call latency of a model-call-shaped request (an
   80 KB JSON body, an SSE answer of 4 events, keep-alive) from a job inside the sandbox to an
   HTTP server on the host, through the unix-socket relay (`network="none"`, the default) vs
   direct (`network="host"`), and the relay's setup (host relay + in-sandbox forwarder).

    python benchmarks/sandbox_overhead.py [--repeats 10] [--tasks 3] [--calls 300]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import warnings  # noqa: E402

from harness_gym.sandbox import available_sandboxes, load_sandbox  # noqa: E402
from harness_gym.sandbox.bwrap import BwrapSandboxBackend, bwrap_available  # noqa: E402
from harness_gym.sandbox.base import SandboxBackend, SandboxSpec  # noqa: E402
from harness_gym.tasks import Task, apply_patch, grade, load_tasks, materialize  # noqa: E402

# The sandboxes run the tasks' `python -m pytest`: this interpreter (it has pytest) goes first.
PATH_ENV = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


def best_ms(samples: list[float]) -> float:
    return min(samples) * 1000


def lifecycle(backend_name: str, task: Task, repeats: int) -> tuple[float, ...]:
    """Best create, exec, kill_processes and close times (ms) for one backend."""
    backend = load_sandbox(backend_name)
    create, run, kill, close = [], [], [], []
    try:
        for _ in range(repeats):
            with tempfile.TemporaryDirectory() as scratch:
                repo = Path(scratch) / "repo"
                materialize(task, repo)
                started = time.perf_counter()
                sandbox = backend.create(SandboxSpec(repo=repo, env=PATH_ENV, label="bench"))
                created = time.perf_counter()
                result = sandbox.exec("true")
                ran = time.perf_counter()
                sandbox.kill_processes()
                killed = time.perf_counter()
                sandbox.close()
                closed = time.perf_counter()
                if result.exit_code != 0:
                    raise RuntimeError(f"`true` exited {result.exit_code}: {result.stderr}")
                create.append(created - started)
                run.append(ran - created)
                kill.append(killed - ran)
                close.append(closed - killed)
    finally:
        backend.close()
    return best_ms(create), best_ms(run), best_ms(kill), best_ms(close)


def direct_pytest_s(backend: SandboxBackend, task: Task) -> float:
    """The task's test command, run directly in a sandbox whose checkout holds both patches."""
    with tempfile.TemporaryDirectory() as scratch:
        repo = Path(scratch) / "repo"
        materialize(task, repo)
        for diff in (task.patch, task.test_patch):
            subprocess.run(["git", "apply", "-"], input=diff, text=True, cwd=repo, check=True)
        with backend.create(SandboxSpec(repo=repo, env=PATH_ENV, label="bench")) as box:
            started = time.perf_counter()
            result = box.exec(task.test_cmd, timeout=300)
            elapsed = time.perf_counter() - started
    if result.exit_code != 0:
        raise RuntimeError(f"{task.instance_id}: the tests failed directly: {result.stdout[-500:]}")
    return elapsed


def graded_s(backend: SandboxBackend, task: Task) -> tuple[float, float]:
    """`grade()` time and create + apply gold + grade + close time (s)."""
    with tempfile.TemporaryDirectory() as scratch:
        repo = Path(scratch) / "repo"
        materialize(task, repo)
        started = time.perf_counter()
        with backend.create(SandboxSpec(repo=repo, env=PATH_ENV, label="bench")) as box:
            apply_patch(box, task.patch, allow_fuzz=False)
            grade_started = time.perf_counter()
            result = grade(task, box, timeout_s=300)
            grading = time.perf_counter() - grade_started
        total = time.perf_counter() - started
    if result.outcome != "passed":
        raise RuntimeError(f"{task.instance_id} graded {result.outcome}: {result.error}")
    return grading, total


# A model-call-shaped server: reads the body, answers 4 SSE events; HTTP/1.1 keep-alive.
_MODEL_SERVER = r"""
import http.server, sys
EVENTS = b"".join(b'data: {"choices":[{"delta":{"content":"tok%d"}}]}\n\n' % i for i in range(3))
EVENTS += b"data: [DONE]\n\n"
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # as uvicorn does
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(EVENTS)))
        self.end_headers()
        self.wfile.write(EVENTS)
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
"""

# The harness's side: N calls on one keep-alive connection; prints each call's seconds.
_MODEL_CLIENT = r"""
import http.client, json, sys, time
url, n = sys.argv[1], int(sys.argv[2])
host, port = url.split("//")[1].split(":")
body = json.dumps({"messages": [{"role": "user", "content": "x" * 80_000}], "stream": True})
conn = http.client.HTTPConnection(host, int(port), timeout=30)
for i in range(n):
    started = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    conn.getresponse().read()
    print(time.perf_counter() - started)
"""


def relay_latency(calls: int) -> dict[str, float] | None:
    """p50 per-call ms through the relay and direct, and the relay's setup ms (None: no bwrap)."""
    if not bwrap_available() or not bwrap_available("host"):
        return None
    server = subprocess.Popen([sys.executable, "-c", _MODEL_SERVER], stdout=subprocess.PIPE)
    try:
        assert server.stdout is not None
        url = f"http://127.0.0.1:{int(server.stdout.readline())}"
        figures: dict[str, float] = {}
        for network in ("none", "host"):
            backend = BwrapSandboxBackend(network=network)
            with backend.create(SandboxSpec(env=PATH_ENV, label="bench")) as box:
                started = time.perf_counter()
                inside = box.proxy_url(url)
                job = box.start(["python", "-c", _MODEL_CLIENT, inside, str(calls)])
                run = job.wait(timeout=600)
                if run.exit_code != 0:
                    raise RuntimeError(f"the client failed under network={network}: {run.stderr}")
                times = [float(t) for t in run.stdout.split()]
                figures[f"{network}_p50_ms"] = statistics.median(times[10:]) * 1000
                figures[f"{network}_p90_ms"] = statistics.quantiles(times[10:], n=10)[-1] * 1000
                figures[f"{network}_first_ms"] = times[0] * 1000
                figures[f"{network}_job_s"] = time.perf_counter() - started
        return figures
    finally:
        server.kill()
        server.wait()


def relay_setup_ms(repeats: int) -> float:
    """Best time (ms) for `proxy_url` + a started `true` under network="none": host relay and
    in-sandbox forwarder, against the same job without a relay."""
    backend = BwrapSandboxBackend()
    with_relay, without = [], []
    for _ in range(repeats):
        for relay, into in ((True, with_relay), (False, without)):
            with backend.create(SandboxSpec(env=PATH_ENV, label="bench")) as box:
                started = time.perf_counter()
                if relay:
                    box.proxy_url("http://127.0.0.1:9")
                box.start("true").wait(timeout=60)
                into.append(time.perf_counter() - started)
    return best_ms(with_relay) - best_ms(without)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--tasks", type=int, default=3, help="built-in tasks to grade")
    parser.add_argument("--calls", type=int, default=300, help="model calls through the relay")
    args = parser.parse_args()
    tasks = load_tasks("builtin")[: args.tasks]
    warnings.simplefilter("ignore")  # local's warning that it does not isolate: measured anyway

    print(f"1. sandbox lifecycle, best of {args.repeats} (ms)")
    columns = ("create", "exec true", "kill", "close", "total")
    print(f"   {'backend':<8} " + " ".join(f"{c:>9}" for c in columns))
    working: list[str] = []
    for name in available_sandboxes():
        try:
            create, run, kill, close = lifecycle(name, tasks[0], args.repeats)
        except Exception as error:  # a backend that cannot start here: say why, move on
            print(f"   {name:<8} skipped: {type(error).__name__}: {str(error)[:100]}")
            continue
        working.append(name)
        total = create + run + kill + close
        print(f"   {name:<8} " + " ".join(f"{v:9.1f}" for v in (create, run, kill, close, total)))

    print(
        f"\n2. grading a gold-patched task vs its pytest command run directly in the same "
        f"backend, best of {args.repeats}, interleaved (s; ratio = grade / direct)"
    )
    header = f"   {'task':<26}"
    for name in working:
        header += f" | {name + ' direct':>13} {'grade':>6} {'ratio':>6}"
    print(header)
    backends = {name: load_sandbox(name) for name in working}
    ratios: dict[str, list[float]] = {name: [] for name in working}
    try:
        for task in tasks:
            # Interleaved and best-of: other load on the machine hits every column alike.
            direct: dict[str, list[float]] = {name: [] for name in working}
            graded: dict[str, list[float]] = {name: [] for name in working}
            failed: dict[str, str] = {}
            for _ in range(args.repeats):
                for name, backend in backends.items():
                    if name in failed:
                        continue
                    try:
                        direct[name].append(direct_pytest_s(backend, task))
                        graded[name].append(graded_s(backend, task)[0])
                    except Exception as error:
                        failed[name] = f"failed: {type(error).__name__}: {error}"[:60]
            row = f"   {task.instance_id:<26}"
            for name in working:
                if name in failed:
                    row += f" | {failed[name]:>27}"
                    continue
                ratio = min(graded[name]) / min(direct[name])
                ratios[name].append(ratio)
                row += f" | {min(direct[name]):13.3f} {min(graded[name]):6.3f} {ratio:6.2f}"
            print(row)
    finally:
        for backend in backends.values():
            backend.close()
    for name, values in ratios.items():
        if values:
            print(f"   {name}: grade() takes {statistics.median(values):.2f}x the bare test run")

    relay = relay_latency(args.calls)
    if relay is None:
        print("\n3. the bwrap proxy relay: skipped (bubblewrap cannot make namespaces here)")
    else:
        print(f"\n3. a model call from inside bwrap, {args.calls} calls on one connection (ms)")
        print(f"   {'path':<28} {'p50':>7} {'p90':>7} {'first':>7}")
        for network, label in (("none", "relay (network=none)"), ("host", "direct (network=host)")):
            print(f"   {label:<28} {relay[network + '_p50_ms']:7.2f} "
                  f"{relay[network + '_p90_ms']:7.2f} {relay[network + '_first_ms']:7.2f}")
        print(f"   the relay adds {relay['none_p50_ms'] - relay['host_p50_ms']:.2f} ms per call "
              f"(p50); setting it up adds {relay_setup_ms(args.repeats):.0f} ms per rollout")


if __name__ == "__main__":
    main()
