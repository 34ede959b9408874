"""Attacks an agent can make on its own episode from inside a real one, and faults that must
stay inside one rollout (issue 11: attack class 7, items 2, 3 and 5).

Real parts throughout: the real Pi CLI, the env's real proxy, real sandboxes, real grading. The
policy is scripted (`ScriptedEngine` over the tiny model: real tokens and scores): its tool calls
run the attack through Pi's own `bash` tool, as a policy that had learned it would.

- A process the agent leaves behind (setsid, nohup, `env -i`) that waits for the grader and then,
  while the tests run, copies the fix into the code under test (the agent's own patch fixes
  nothing) or rewrites every test file so its assertions hold: killed before grading, on every
  backend. A control shows the first passes when that step is skipped.
- From inside a default (`bwrap`) episode, agent code cannot reach a listener on the host's
  loopback, cannot create, read or delete a proxy session, while its model calls work.
- An agent cannot delete its own session (403); a session closed under it, or an agent that
  cuts its own line to the proxy, ends `harness_error`, with no exception.
- A 4-env vector step where three agents attack (fork bomb, filling the disk, flooding the
  CLI's stdout) and one solves the task: every result comes back, the solver passes, and no
  sandbox dir or process is left.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import socket
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
from sandbox_conformance import alive, wait_until
from support.engines import shell_script
from support.grading import backend_params, unavailable

import harness_gym  # noqa: F401  (registers HarnessSWE-v0)
from harness_gym.config import EpisodeConfig
from harness_gym.engines import load_engine
from harness_gym.engines.scripted import ScriptedEngine
from harness_gym.episode import EpisodeRunner
from harness_gym.harness import load_harness
from harness_gym.proxy import InterceptionProxy
from harness_gym.sandbox import SandboxBackend, load_sandbox
from harness_gym.sandbox._cgroups import cgroup_parent, memory_parent
from harness_gym.sandbox._pidns import how as pid_namespace
from harness_gym.sandbox.bwrap import BwrapSandboxBackend
from harness_gym.tasks.diffs import paths_touched_by
from harness_gym.tasks.loader import load_tasks

PI = load_harness("pi")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.skipif(not PI.is_installed(), reason="Pi is not installed: `harness-gym harnesses --install`"),
    pytest.mark.filterwarnings("ignore::harness_gym.sandbox.UnisolatedSandboxWarning"),
]

TASKS = load_tasks("builtin")
_NO_BWRAP = unavailable("bwrap")
BACKENDS = backend_params("local", "bwrap", "docker")

@pytest.fixture(scope="module")
def tiny() -> Iterator[Any]:
    engine = load_engine("tiny")
    yield engine
    engine.close()


def gold(task: Any) -> str:
    """The shell command that applies the task's gold patch (what the oracle runs)."""
    return f"git apply --whitespace=nowarn <<'HARNESS_GYM_PATCH'\n{task.patch}HARNESS_GYM_PATCH"


def sandbox_dirs() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "harness-gym-*")))


class WatchedBackend(SandboxBackend):
    """A real backend that counts, just before each `kill_processes()`, the processes carrying
    `token`: evidence that the attack was still running when the agent's turn ended. With
    `skip_kill` the step is left out (the control that shows an attack works)."""

    def __init__(self, inner: SandboxBackend, token: str, skip_kill: bool = False) -> None:
        self.inner, self.token, self.skip_kill = inner, token, skip_kill
        self.name, self.runs_images = inner.name, inner.runs_images
        self.alive_at_kill: list[int] = []

    def create(self, spec):  # type: ignore[no-untyped-def]
        box = self.inner.create(spec)
        kill = box.kill_processes

        def watched_kill() -> None:
            self.alive_at_kill.append(len(alive(self.token)))
            if not self.skip_kill:
                kill()

        box.kill_processes = watched_kill  # type: ignore[method-assign]
        return box

    def close(self) -> None:
        self.inner.close()


def run_episode(engine: Any, backend: SandboxBackend, task: Any, **settings: Any) -> dict:
    env = gym.make("HarnessSWE-v0", harness="pi", engine=engine, sandbox=backend,
                   episode_timeout_s=300, test_timeout_s=300, progress=False, **settings)
    try:
        env.reset(options={"task_id": task.instance_id})
        _, _, _, _, info = env.step(None)
    finally:
        env.close()
    return info


def run_on_proxy(proxy: InterceptionProxy, task: Any) -> Any:
    """Pi's episode of `task` through `proxy` (started; stopped after), on bwrap where it runs."""
    backend = load_sandbox("bwrap" if _NO_BWRAP is None else "local")
    config = EpisodeConfig(harness=PI, engine=proxy.engine, sandbox=backend,
                           episode_timeout_s=300, test_timeout_s=300)
    runner = EpisodeRunner(proxy, PI, backend, config)
    try:
        return runner.run(task)
    finally:
        runner.close()
        proxy.stop()
        backend.close()


# What the process left behind does once the grader has touched the tests: copy the fix into
# the code under test (the agent's own patch fixes nothing), or rewrite every test file so that
# each assertion holds (`assert x` -> `assert True or x`), again and again while they run.
PAYLOADS = {
    "fixes_the_code": 'cp -r "$1/fixed/." .',
    "rewrites_the_tests": "sed -i 's/^\\( *\\)assert /\\1assert True or /' tests/*.py",
}


def lingering_attack(task: Any, token: str, escape: str, payload: str) -> str:
    """The agent's command: keep the fixed source aside, leave the tree unfixed, and leave a
    process that waits for the grader (its directory in HOME, or the test patch applied), then
    runs `payload` every 10 ms."""
    test_file = next(p for p in paths_touched_by(task.test_patch) if p.endswith(".py"))
    grader_started = f'! cmp -s {test_file} "$1/orig" || compgen -G "$2/.harness-gym-grader-*"'
    loop = (
        f'cd "$0"; until {grader_started} >/dev/null; do sleep 0.01; done; '
        f"while :; do {PAYLOADS[payload]}; sleep 0.01; : {token}; done"
    ).replace("'", "'\\''")
    return (
        f"{gold(task)}\n"
        'mkdir -p "$HOME/aside/fixed" && git diff --name-only | '
        'xargs -I{} cp --parents {} "$HOME/aside/fixed/" && git checkout -q -- . && '
        f'cp {test_file} "$HOME/aside/orig"\n'
        f"{escape} bash -c '{loop}' \"$PWD\" \"$HOME/aside\" \"$HOME\" >/dev/null 2>&1 </dev/null\n"
        "git status --short; echo left-running"
    )


@pytest.mark.parametrize("payload", list(PAYLOADS))
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_a_process_the_agent_leaves_running_cannot_change_the_verdict(
    tiny: Any, backend_name: str, payload: str
) -> None:
    task = TASKS[0]
    token = uuid.uuid4().hex
    # On local without a cgroup or a pid namespace, a scrubbed environment would escape the
    # marker search (the module doc of local.py says so); every other case gets the strongest.
    scrubbed = backend_name != "local" or cgroup_parent() is not None or pid_namespace() is not None
    escape = 'setsid -f env -i PATH="$PATH" nohup' if scrubbed else "setsid -f nohup"
    command = lingering_attack(task, token, escape, payload)
    backend = WatchedBackend(load_sandbox(backend_name), token)
    info = run_episode(ScriptedEngine(tiny, shell_script([command])), backend, task)
    assert info["patch"] == ""  # the agent is credited with no change at all
    if backend_name != "bwrap":  # under bwrap it died with Pi's pid namespace already
        # It outlived the harness, waiting for the grader (a fork of its loop, caught before it
        # execs `cmp` or `sleep`, carries the same command line: one or more).
        assert len(backend.alive_at_kill) == 1 and backend.alive_at_kill[0] >= 1
    assert info["outcome"] == "failed", (info["outcome"], info["error"], info["grade"])
    assert all(info["tests"].get(t) != "PASSED" for t in task.FAIL_TO_PASS)
    assert alive(token) == []


def test_without_the_kill_step_that_process_would_have_passed(tiny: Any) -> None:
    """The control: the attack above is real. With `kill_processes` skipped, the process that
    fixes the code while the tests run turns a patch that fixes nothing into a pass. (The one
    that rewrites the tests is also caught by the grader, which checks the test modules pytest
    loaded: `tampered`.)"""
    # The process races the grader's pytest to the code (it polls every 10 ms): on a loaded
    # machine it can lose a round, so the control gets three tries; one pass shows it is real.
    task = TASKS[0]
    verdicts = []
    for _ in range(3):
        token = uuid.uuid4().hex
        backend = WatchedBackend(load_sandbox("local"), token, skip_kill=True)
        command = lingering_attack(task, token, "setsid -f nohup", "fixes_the_code")
        info = run_episode(ScriptedEngine(tiny, shell_script([command])), backend, task)
        assert info["patch"] == "", info["patch"]
        assert wait_until(lambda: alive(token) == [])  # close() still ends it
        verdicts.append(info["outcome"])
        if info["outcome"] == "passed":
            break
    assert "passed" in verdicts, verdicts


class CountingListener:
    """A real TCP listener on the host's loopback that counts the connections it accepts."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()


# Agent code probing what it can reach: a host service and the proxy's admin routes, with its
# own session key (from Pi's config) and with none; `OTHER` is another live session's id.
PROBE = r"""python3 - <<'EOF'
import json, os, socket, urllib.error, urllib.request
cfg = json.load(open(os.path.expanduser("~/.pi/agent/models.json")))["providers"]["harness-gym"]
base, key = cfg["baseUrl"].rsplit("/v1", 1)[0], cfg["apiKey"]
said = {}
try:
    socket.create_connection(("127.0.0.1", PORT), timeout=5).close()
    said["host_service"] = "connected"
except OSError as exc:
    said["host_service"] = type(exc).__name__
def call(name, method, path, auth):
    headers = {"Content-Type": "application/json"}
    if auth:
        headers["Authorization"] = "Bearer " + auth
    req = urllib.request.Request(base + path, data=b"{}" if method == "POST" else None,
                                 method=method, headers=headers)
    try:
        said[name] = urllib.request.urlopen(req, timeout=10).status
    except urllib.error.HTTPError as exc:
        said[name] = exc.code
    except OSError as exc:
        said[name] = type(exc).__name__
for auth, who in ((key, "key"), (None, "nokey")):
    call(f"create_{who}", "POST", "/sessions", auth)
    call(f"read_own_{who}", "GET", f"/sessions/{key}/trace", auth)
    call(f"read_other_{who}", "GET", "/sessions/OTHER/trace", auth)
    call(f"delete_other_{who}", "DELETE", "/sessions/OTHER", auth)
    call(f"delete_own_{who}", "DELETE", f"/sessions/{key}", auth)
print("PROBE" + json.dumps(said) + "EBORP")
EOF"""


DELETE_OWN = r"""python3 - <<'EOF'
import json, os, urllib.error, urllib.request
cfg = json.load(open(os.path.expanduser("~/.pi/agent/models.json")))["providers"]["harness-gym"]
base, key = cfg["baseUrl"].rsplit("/v1", 1)[0], cfg["apiKey"]
req = urllib.request.Request(f"{base}/sessions/{key}", method="DELETE",
                             headers={"Authorization": "Bearer " + key})
try:
    print("HTTP", urllib.request.urlopen(req, timeout=10).status)
except urllib.error.HTTPError as error:
    print("HTTP", error.code)
EOF"""


@pytest.mark.skipif(_NO_BWRAP is not None, reason=str(_NO_BWRAP))
def test_a_default_episode_reaches_its_model_and_nothing_else(tiny: Any) -> None:
    task = TASKS[1]
    listener = CountingListener()
    seen: list[str] = []

    def commands(prompt: str) -> list[str]:
        if "<tool_response>" in prompt and "PROBE{" in prompt:  # the output, not the call
            seen.append("{" + prompt.rsplit("PROBE{", 1)[1].split("EBORP", 1)[0])
        return [probe, gold(task)]

    engine = ScriptedEngine(tiny, shell_script(commands))
    env = gym.make("HarnessSWE-v0", harness="pi", engine=engine, episode_timeout_s=300,
                   progress=False)  # sandbox: the default
    try:
        stack = env.unwrapped._start()
        assert stack.backend.name == "bwrap"
        other = stack.proxy.open_session()
        probe = PROBE.replace("PORT", str(listener.port)).replace("OTHER", other.session_id)
        env.reset(options={"task_id": task.instance_id})
        _, reward, _, _, info = env.step(None)
        assert stack.proxy.sessions.find(other.session_id) is other  # still there
    finally:
        env.close()
        listener.close()
    said = json.loads(seen[0])
    assert listener.accepted == 0 and said.pop("host_service") == "ConnectionRefusedError"
    # Every admin route: 403 with its session key, 401 without a key.
    assert {k: v for k, v in said.items() if k.endswith("_key")} == dict.fromkeys(
        [k for k in said if k.endswith("_key")], 403), said
    assert {k: v for k, v in said.items() if k.endswith("_nokey")} == dict.fromkeys(
        [k for k in said if k.endswith("_nokey")], 401), said
    assert info["outcome"] == "passed" and reward > 0, info["error"]  # its model calls work
    assert info["n_llm_calls"] == 3


def test_an_agent_cannot_delete_its_own_session(tiny: Any) -> None:
    # A session key is no admin key: the proxy refuses it on /sessions (403), the episode goes on.
    task = TASKS[2]
    outputs: list[str] = []

    def commands(prompt: str) -> list[str]:
        if "<tool_response>" in prompt:
            outputs.append(prompt.rsplit("<tool_response>", 1)[1])
        return [DELETE_OWN, gold(task)]

    proxy = InterceptionProxy(ScriptedEngine(tiny, shell_script(commands))).start()
    result = run_on_proxy(proxy, task)
    assert "HTTP 403" in outputs[0], outputs[0]
    assert result.outcome == "passed" and result.reward > 0, result.error


def test_a_session_closed_under_the_agent_ends_harness_error(tiny: Any) -> None:
    # Closed by the proxy's owner (or its idle expiry) while the agent runs: the episode ends
    # harness_error, keeping the calls made before, and never raises.
    task = TASKS[2]
    proxy: InterceptionProxy

    def commands(prompt: str) -> list[str]:
        if "<tool_response>" not in prompt:  # the first call: close the session 1 s later
            sid = next(iter(proxy.sessions.ids()))
            threading.Timer(1.0, proxy.close_session, (sid,)).start()
        return ["sleep 3", gold(task)]

    proxy = InterceptionProxy(ScriptedEngine(tiny, shell_script(commands))).start()
    result = run_on_proxy(proxy, task)  # no exception
    assert result.outcome == "harness_error" and "proxy session" in result.error, result.error
    assert result.n_llm_calls == 1 and result.reward == 0.0
    assert result.trace.segments  # the calls before the closing are kept
    assert len(proxy.sessions) == 0


@pytest.mark.skipif(_NO_BWRAP is not None, reason=str(_NO_BWRAP))
def test_an_agent_that_cuts_its_own_line_to_the_model_ends_harness_error(tiny: Any) -> None:
    # It kills the forwarder in its network namespace: Pi's connection to the proxy drops and
    # no later call gets through.
    cut = "pkill -9 -f 'uni[x]:/'; sleep 1; echo cut"  # [x]: not its own command line
    info = run_episode(ScriptedEngine(tiny, shell_script([cut, "echo unreachable"])),
                       load_sandbox("bwrap"), TASKS[4])
    assert info["outcome"] == "harness_error", (info["outcome"], info["error"])
    assert info["n_llm_calls"] == 1


@pytest.mark.skipif(_NO_BWRAP is not None, reason=str(_NO_BWRAP))
@pytest.mark.skipif(shutil.which("pgrep") is None, reason="needs pgrep")
def test_in_a_vector_step_three_attacking_agents_break_only_their_own_episodes(
    tiny: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The leak check counts sandbox dirs in a temp dir of this test's own: another process's
    # episodes (a training run, a second test lane) come and go in the machine's.
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private_tmp))
    monkeypatch.setenv("TMPDIR", str(private_tmp))
    tasks = TASKS[3:8]
    token = uuid.uuid4().hex
    # In the foreground: Pi's tool call waits on it, so its turn cannot go on beside the bomb.
    bomb = f"bash -c 'b() {{ b | b; }}; b; : {token}' >/dev/null 2>&1 </dev/null"
    fill = "for i in $(seq 4000); do head -c 1048576 /dev/zero > fill$i || break; done"
    # Straight into the CLI's own stdout, which the env reads back: 100 MiB of it.
    flood = ("pi=$(pgrep -o -f 'pi -p') && head -c 104857600 /dev/zero | tr '\\0' x "
             "> /proc/$pi/fd/1; echo flooded")
    # Three times the sandbox's memory cap in one process (memset: every page is touched).
    hog = "python3 -c 'b = bytearray(3 * 2**29); print(len(b))'; echo hog=$?"
    attacks = {tasks[0].problem_statement[:200]: [bomb],
               tasks[1].problem_statement[:200]: [fill],
               tasks[2].problem_statement[:200]: [flood],
               tasks[3].problem_statement[:200]: [gold(tasks[3])],
               tasks[4].problem_statement[:200]: [hog]}

    def commands(prompt: str) -> list[str]:
        return next(c for key, c in attacks.items() if key in prompt)

    backend = BwrapSandboxBackend(pids=256, disk_bytes=256 * 2**20, memory_bytes=512 * 2**20)
    before = sandbox_dirs()
    vec = gym.make_vec("HarnessSWE-v0", num_envs=5, vectorization_mode="vector_entry_point",
                       harness="pi", engine=ScriptedEngine(tiny, shell_script(commands)),
                       sandbox=backend, episode_timeout_s=300, test_timeout_s=300,
                       progress=False)
    try:
        vec.reset(options={"task_ids": [t.instance_id for t in tasks]})
        made_here = sandbox_dirs() - before  # the env's repos: the private dir is the one used
        _, rewards, _, _, infos = vec.step(None)
    finally:
        vec.close()
    outcomes = list(infos["outcome"])
    # The bomb: its episode ends alone, at the full pid cap (`sandbox/_pids.py`), with the
    # reason (before, Pi could wait out the 300 s with its pid table full).
    assert outcomes[0] == "harness_error" and "process cap of 256" in infos["error"][0], (
        outcomes[0], infos["error"][0])
    assert outcomes[1] == "harness_error" and "disk cap" in infos["error"][1]
    assert outcomes[2] in ("failed", "harness_error"), infos["error"][2]
    assert outcomes[3] == "passed" and rewards[3] > 0, infos["error"][3]
    # The hog: killed at the cgroup's cap (root: the episode says so), or MemoryError at
    # RLIMIT_DATA (non-root: the agent sees it and its unfixed tree fails).
    assert outcomes[4] in ("failed", "harness_error"), infos["error"][4]
    if memory_parent() is not None:
        assert outcomes[4] == "harness_error" and "memory cap" in infos["error"][4]
    assert wait_until(lambda: alive(token) == [], timeout=10)
    assert made_here and sandbox_dirs() - before == set()
    parent = cgroup_parent()
    if parent is not None:
        assert not list(Path(parent).glob(f"{os.getpid()}-*"))
