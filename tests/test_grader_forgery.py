"""Forgery from inside the test process: code under test written against this grader, which
reaches the grader through pytest's own objects by plain attribute walks (no audit event marks
them), drives pytest's machinery, patches the grader's code, forks, or writes to the file
descriptors it inherited.

Each attack runs on the unfixed calc task (its F2P test fails without a fix), so only a forged
verdict could pass it, on `bwrap` and `docker` (tasks/sandbox_grading/engine.py and guard.py say
what stops each); the moves that depend on the user (reading another process's memory) run as
root here and, on bwrap, as a throwaway non-root user too.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
from harness_gym.rewards import RewardConfig
from harness_gym.tasks import TestStatus
from test_grader_attacks import _init_with, backend

from support.as_user import run_as_user, why_not
from support.grading import CALC, F2P, assert_failed, gold, grade_cases, run_agent, shell

__all__ = ["backend"]  # the fixture, shared

# Found by walking up from the code under test's own frame (sys._getframe is allowed: logging
# uses it), through pytest's frames, to the test item and pytest's config: attribute reads only.
FIND = '''
import sys
def _pytest_objects():
    frame, found = sys._getframe(), {}
    while frame is not None:
        for name, value in list(frame.f_locals.items()):
            if name == "item" and hasattr(value, "ihook"):
                found.setdefault("item", value)
            if name == "session" and hasattr(value, "items"):
                found.setdefault("session", value)
            if hasattr(getattr(value, "config", None), "pluginmanager"):
                found.setdefault("config", value.config)
        frame = frame.f_back
    return found
_grader = sys.modules["_harness_gym_grading.pytest_plugin"]
'''

# Through pytest's plugin registry to the grader's hook functions and what they hold.
READ_THE_HOOKS_DEFAULTS = FIND + '''
try:
    _send = _grader.pytest_runtest_call.__defaults__[0]
    _send(("observe", (None, "call", None)))
except RuntimeError:
    pass
'''


def in_the_f2p_call(body: str) -> str:
    """Code under test that runs `body` once, inside the F2P test's call of `calc.core.mean`
    (with FIND's helpers), then computes the mean as the unfixed code does."""
    return FIND + """
from . import core as _core
_real_mean = _core.mean
_busy = []
def mean(values):
    if not _busy:
        _busy.append(1)
%s
    return _real_mean(values) if values else 0
_core.mean = mean
""" % textwrap.indent(body.strip("\n"), " " * 8)


# The grader's own hook wrappers, driven by hand for the F2P item with an outcome that raised
# nothing.
CALL_THE_GRADERS_HOOKS = in_the_f2p_call("""
class _Outcome(object):
    excinfo = None
    outcome = "passed"
    def get_result(self):
        return self
wrapper = _grader.pytest_runtest_call(_pytest_objects()["item"])
next(wrapper)
try:
    wrapper.send(_Outcome())
except StopIteration:
    pass
""")

# pytest's own runner runs the F2P item again, nested (its assertions would be the same; this
# is how a forged second run would reach the grader).
RERUN_THROUGH_PYTEST = in_the_f2p_call("""
import _pytest.runner
_pytest.runner.runtestprotocol(_pytest_objects()["item"], log=True, nextitem=None)
""")

# pytest's hook called from a thread of the code under test's own: no frame of its code there.
FROM_A_THREAD = in_the_f2p_call("""
import threading
item = _pytest_objects()["item"]
thread = threading.Thread(target=item.ihook.pytest_runtest_protocol,
                          kwargs=dict(item=item, nextitem=None))
thread.start()
thread.join()
""")

# The grader's own classes patched so every verdict is a pass.
PATCH_THE_GRADER = FIND + '''
_grader._Run.verdict = lambda self, item, state: ("PASSED", None)
'''

# A plugin of its own, in a file outside the work tree (/tmp: the restore never sees it),
# registered through pytest's plugin manager: its hook wrapper turns the call phase's failure
# into a result.
FORCE_RESULT_PLUGIN = FIND + """
import importlib.util, os, tempfile
_path = os.path.join(tempfile.mkdtemp(), "helpful_plugin.py")
with open(_path, "w") as _f:
    _f.write(
        "import pytest\\n"
        "@pytest.hookimpl(hookwrapper=True)\\n"
        "def pytest_runtest_call(item):\\n"
        "    outcome = yield\\n"
        "    outcome.force_result(None)\\n"
    )
_spec = importlib.util.spec_from_file_location("helpful_plugin", _path)
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
_pytest_objects()["config"].pluginmanager.register(_module, "helpful")
"""

# A profile function installed by the code under test, looking for the grader's state in every
# frame it is handed (the grader turns it off while it handles an event, so it finds none; the
# install by the code under test is refused).
PROFILER = """
import sys
def _profile(frame, event, arg):
    for value in list(frame.f_locals.values()):
        if hasattr(value, "channel") and hasattr(value, "states"):
            value.channel.record("test", id="%s", status="PASSED")
sys.setprofile(_profile)
""" % F2P

# A plugin object whose attribute lookups run code inside the grader's handler (it reads the
# plugin's `__file__`): from there, a frame walk back to the grader's state.
GETATTR_INSIDE_THE_GRADER = FIND + """
_walking = []
class _Sneaky(object):
    def __getattr__(self, name):
        if _walking:  # its own hasattr() calls below
            raise AttributeError(name)
        _walking.append(1)
        try:
            frame = sys._getframe(1)
            while frame is not None:
                for value in list(frame.f_locals.values()):
                    if hasattr(value, "channel") and hasattr(value, "states"):
                        value.channel.record("test", id="%s", status="PASSED")
                frame = frame.f_back
        except RuntimeError:
            pass
        finally:
            _walking.pop()
        raise AttributeError(name)
_pytest_objects()["config"].pluginmanager.register(_Sneaky(), "sneaky")
""" % F2P

# A signal handler is handed the frame the interpreter was in: fired every 50 us, it looks for
# the grader's state in that frame and the ones below, and for the hook functions' `_send`.
SIGNAL_FRAMES = """
import signal
_found = []
def _handler(signum, frame):
    while frame is not None:
        local = frame.f_locals
        for value in list(local.values()):
            if hasattr(value, "channel") and hasattr(value, "states") and not _found:
                _found.append(value)
                value.channel.record("test", id="%s", status="PASSED")
        if "_send" in local and callable(local["_send"]) and not _found:
            _found.append(local["_send"])
            local["_send"](("observe", (None, "call", None)))
        frame = frame.f_back
signal.signal(signal.SIGALRM, _handler)
signal.setitimer(signal.ITIMER_REAL, 0.00005, 0.00005)
""" % F2P

# A hook function's link replaced.
REPLACE_THE_DEFAULTS = FIND + '''
try:
    _grader.pytest_runtest_call.__defaults__ = (None,)
except RuntimeError:
    pass
'''

# Continue the session in a forked copy, the parent gone without a word.
FORK_AND_CONTINUE = '''
import os
_pid = os.fork()
if _pid:
    os.waitpid(_pid, 0)
    os._exit(0)
'''

# Read this process's memory (where the key was) through /proc.
READ_OWN_MEMORY = '''
try:
    open("/proc/self/mem", "rb").close()
except (RuntimeError, OSError):
    pass
'''

# `io.FileIO` of a path object hands the object itself to the audit hook's `open` event: a
# metaclass's `__eq__` (a type compared with `in`) or the object's `__repr__` (a refusal's
# message), run by the hook, takes the hook's frame, whose locals hold the run (`_on_tracer` is
# its bound method); it wraps the channel so that the F2P test's record says passed, then
# raises, so that the hook records no refusal. Once with each class. A str subclass as a module
# name (`import` event) or as an attribute name of a forged event (`sys.audit`) runs its
# `__hash__` there the same way, and so does the `__getattr__` of the object a forged
# `object.__getattr__` event names.
STEAL_TEMPLATE = '''
import io, sys
_stolen = []
def _steal():
    for depth in range(2, 6):
        run = getattr(sys._getframe(depth).f_locals.get("_on_tracer"), "__self__", None)
        if run is not None:
            break
    if run is not None and not _stolen:
        _stolen.append(run)
        real = run.channel
        class _Flip:
            def __getattr__(self, name):
                return getattr(real, name)
            def record(self, kind, **fields):
                if kind == "test" and fields.get("id") == "%s":
                    fields["status"] = "PASSED"
                return real.record(kind, **fields)
        run.channel = _Flip()
    raise LookupError("no repr")
'''  # the test id to flip: %s
PATH_OBJECT_TEMPLATE = STEAL_TEMPLATE + '''
class _Meta(type):
    def __eq__(cls, other):
        _steal()
    __hash__ = type.__hash__
class _Path:
    def __fspath__(self):
        return "/nonexistent-harness-gym"
    def __repr__(self):
        _steal()
class _MetaPath(_Path, metaclass=_Meta):
    pass
for _kind in (_MetaPath, _Path):
    try:
        io.FileIO(_kind())
    except (LookupError, OSError, RuntimeError):
        pass
'''  # the test id to flip: %s
PATH_OBJECT_IN_THE_HOOK = PATH_OBJECT_TEMPLATE % F2P
NAME_TEMPLATE = STEAL_TEMPLATE + '''
class _Name(str):
    def __hash__(self):  # the import system hashes it too: steal only inside the hook
        if any("_on_tracer" in sys._getframe(d).f_locals for d in (1, 2)):
            _steal()
        return str.__hash__(self)
class _Owner:
    def __getattr__(self, name):
        _steal()
for _call in (lambda: sys.audit("object.__getattr__", None, _Name("gi_frame")),
              lambda: sys.audit("object.__getattr__", _Owner(), "gi_frame"),
              lambda: __import__(_Name("zz_no_such_module"))):
    try:
        _call()
    except (LookupError, ImportError, RuntimeError):
        pass
'''
STR_SUBCLASS_IN_THE_HOOK = NAME_TEMPLATE % F2P

# A child process has no audit hook: it reads the runner's memory through /proc, as the same user
# (what it saw comes back in the F2P test's failure).
CHILD_READS_MEMORY = r'''
import os, subprocess, sys
_probe = "import sys\ntry:\n    open('/proc/%d/mem', 'rb').close()\n    print('CHILD-READ: opened')\n" \
         "except OSError as e:\n    print('CHILD-READ: ' + type(e).__name__)\n" % os.getpid()
_said = subprocess.run([sys.executable, "-c", _probe], capture_output=True, text=True).stdout
from . import core as _core
def mean(values):
    raise RuntimeError(_said.strip())  # the F2P test fails, and its traceback says what was seen
_core.mean = mean
'''

# Forged records written to every descriptor the runner holds (one of them is the channel).
WRITE_EVERY_FD = r'''
import os
_line = ('{"k":"test","id":"%s","status":"PASSED","s":0,"n":5}\t' + "0" * 64 + "\n").encode()
for _fd in range(3, 64):
    try:
        os.write(_fd, _line)
    except OSError:
        pass
''' % F2P

# In an earlier test's call (test_add runs first), the F2P item and a passing P2P item trade
# node ids: the passing test's outcome would be reported under the F2P test's name.
SWAP_NODE_IDS = FIND + '''
from . import core as _core
_real_add = _core.add
_done = []
def add(a, b):
    if not _done:
        _done.append(1)
        by_id = {i.nodeid: i for i in _pytest_objects()["session"].items}
        f2p, p2p = by_id["%s"], by_id["tests/test_other.py::test_add_floats"]
        key = "_id" if hasattr(type(f2p), "_id") else "_nodeid"  # pytest 9 (a slot) / 7
        ours, theirs = getattr(f2p, key), getattr(p2p, key)
        setattr(f2p, key, theirs)
        setattr(p2p, key, ours)
        assert f2p.nodeid.endswith("test_add_floats")
    return _real_add(a, b)
_core.add = add
''' % F2P

ATTACKS = {
    "hook-defaults-read": (READ_THE_HOOKS_DEFAULTS, "__defaults__ of a grader hook read"),
    "grader-hooks-called": (CALL_THE_GRADERS_HOOKS, "not by the test runner"),
    "rerun-through-pytest": (RERUN_THROUGH_PYTEST, "not by the test runner"),
    "from-a-thread": (FROM_A_THREAD, "outside the runner's main thread"),
    "grader-class-patched": (PATCH_THE_GRADER, "the grader's own code was changed"),
    "defaults-replaced": (REPLACE_THE_DEFAULTS, "__defaults__ of a grader function replaced"),
    "fork-and-continue": (FORK_AND_CONTINUE, "a forked copy of the runner"),
    "force-result-plugin": (FORCE_RESULT_PLUGIN, "neither the runner's nor in the work tree"),
    "profile-function": (PROFILER, "a trace or profile function installed at calc/__init__.py"),
    "getattr-inside-the-grader": (GETATTR_INSIDE_THE_GRADER, "a frame taken while the grader"),
    "own-memory-read": (READ_OWN_MEMORY, "reading a process's memory"),
    "path-object-in-the-hook": (PATH_OBJECT_IN_THE_HOOK, "open() of a path object"),
    "str-subclass-in-the-hook": (STR_SUBCLASS_IN_THE_HOOK, "a module name that is not a str"),
}


@pytest.mark.parametrize("attack", list(ATTACKS), ids=list(ATTACKS))
def test_in_process_forgery_is_caught(backend, tmp_path: Path, attack: str) -> None:
    code, check = ATTACKS[attack]
    result = run_agent(backend, CALC, tmp_path, _init_with(code))
    assert_failed(result, "tampered", says=check)
    if attack == "force-result-plugin":
        # The attack is real: pytest's own summary, and the phases the grader saw (the plugin's
        # wrapper sits inside the grader's), say passed; its hook implementation fails the run.
        assert f"PASSED {F2P}" in result.test_output
    else:
        assert result.tests.get(F2P) != TestStatus.PASSED


def test_a_signal_handler_never_lands_in_the_graders_frames(backend, tmp_path: Path) -> None:
    """Signals are blocked while the grader handles an event; outside one, the handler finds
    only the hook functions' `_send`, and calling it is refused (its frame is on the stack).
    Where the 50 us timer fires is chance, so the reason may be either; the verdict is not."""
    result = run_agent(backend, CALC, tmp_path, _init_with(SIGNAL_FRAMES))
    assert result.outcome == "failed", (result.reason, result.error)
    assert RewardConfig()(result.outcome, 0)[0] == RewardConfig().failure
    assert result.tests.get(F2P) != TestStatus.PASSED
    assert result.reason in ("tampered", "tests_failed", "incomplete"), result.error
    if result.reason == "tampered":
        assert "not by the test runner" in result.error or "introspection" in result.error


def test_swapped_node_ids_do_not_move_a_pass(backend, tmp_path: Path) -> None:
    result = run_agent(backend, CALC, tmp_path, _init_with(SWAP_NODE_IDS))
    assert result.outcome == "failed"
    assert result.tests[F2P] == TestStatus.FAILED  # the outcome stays with the collected id
    assert result.tests["tests/test_other.py::test_add_floats"] == TestStatus.PASSED
    assert f"PASSED {F2P}" in result.test_output  # pytest's own view moved with the swap


def test_records_written_to_every_inherited_fd_do_not_verify(backend, tmp_path: Path) -> None:
    result = run_agent(backend, CALC, tmp_path, _init_with(WRITE_EVERY_FD))
    assert_failed(result, "tampered", says="failed verification")


def test_a_child_process_cannot_read_the_runners_memory(backend, tmp_path: Path) -> None:
    result = run_agent(backend, CALC, tmp_path, _init_with(CHILD_READS_MEMORY))
    assert "CHILD-READ: PermissionError" in result.test_output, result.test_output[-2000:]
    assert_failed(result, "tests_failed")  # what it saw is nothing: the test fails on its merits
    assert result.tests[F2P] == TestStatus.FAILED


# --- local: the same in-process defences; the interpreter itself is the agent's to write ------


def _local_cases() -> dict[str, tuple[list, str, str]]:
    """name -> (moves, reason, what the error says): every in-process attack of this file and
    the introspection class of test_grader_attacks (gc, frames, ctypes, sys.modules)."""
    from test_grader_attacks import CTYPES_READ, FRAME_WALK, GC_WALK, MODULE_REPLACEMENT

    cases = {name: ([_init_with(code)], "tampered", says) for name, (code, says) in ATTACKS.items()}
    for name, code, says in (
        ("gc-walk", GC_WALK, "gc.get_objects() called while the grader runs"),
        ("frame-walk", FRAME_WALK, "gi_frame of the grader's own"),
        ("ctypes-read", CTYPES_READ, "ctypes.string_at: ctypes memory access"),
        ("sys.modules-replacement", MODULE_REPLACEMENT,
         "sys.modules['_harness_gym_grading.channel'] was replaced"),
    ):  # fmt: skip
        cases[name] = ([gold(CALC), _init_with(code)], "tampered", says)
    cases["fd-records"] = ([_init_with(WRITE_EVERY_FD)], "tampered", "failed verification")
    cases["child-reads-memory"] = ([_init_with(CHILD_READS_MEMORY)], "tests_failed", "")
    return cases


@pytest.mark.filterwarnings("ignore::harness_gym.sandbox.UnisolatedSandboxWarning")
def test_on_local_the_in_process_forgeries_are_caught(tmp_path: Path) -> None:
    """`local` runs the grader's plugin in the same interpreter as bwrap does (the venv's):
    every in-process attack is refused there too, side by side, three sandboxes at a time."""
    import os

    cases = _local_cases()
    results = grade_cases("local", list(cases), lambda backend, name: run_agent(
        backend, CALC, tmp_path / name, *cases[name][0]))  # fmt: skip
    wrong = {}
    for name, result in results.items():
        _, reason, says = cases[name]
        try:
            assert_failed(result, reason, says=says)
            if name == "force-result-plugin":
                assert f"PASSED {F2P}" in result.test_output
            elif name == "child-reads-memory":
                # A limit of `local`, measured: as root the child keeps CAP_SYS_PTRACE (no user
                # namespace), which PR_SET_DUMPABLE does not stop; the runner's memory is open.
                said = [x for x in result.test_output.splitlines() if "CHILD-READ" in x]
                opened = os.geteuid() == 0
                assert said and ("CHILD-READ: opened" in said[-1]) == opened, said
        except AssertionError as error:
            wrong[name] = str(error)[:600]
    assert not wrong, wrong


# What `local` cannot give: the interpreter that grades is the host's, writable by the agent.
# A `.pth` the agent drops into its site-packages runs at start-up, before the grader's plugin,
# claims the first key and writes a whole passing session.
FORGE_AT_STARTUP = r"""
import os
if os.environ.get("HARNESS_GYM_GRADER_KEYS"):
    from _harness_gym_grading.channel import open_channel
    _channel = open_channel()
    _channel.record("start", runner="pytest")
    for _test in %r:
        _channel.record("test", id=_test, status="PASSED")
    _channel.record("end", exitstatus=0)
    os._exit(0)
"""


@pytest.mark.filterwarnings("ignore::harness_gym.sandbox.UnisolatedSandboxWarning")
def test_on_local_an_agent_that_writes_into_the_interpreter_forges_a_pass(tmp_path: Path) -> None:
    """The documented limit of `local` (docs/reward-integrity.md): measured, not assumed. The
    interpreter here is a throwaway venv the test owns (the shared one is never written)."""
    import os
    import site
    import subprocess
    import sysconfig

    from harness_gym.sandbox.local import LocalSandboxBackend

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    purelib = Path(sysconfig.get_path("purelib", vars={"base": str(venv)}))
    (purelib / "host-packages.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    judged = CALC.FAIL_TO_PASS + CALC.PASS_TO_PASS
    (purelib / "zz_agent.py").write_text(FORGE_AT_STARTUP % (judged,))
    env = {"PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    backend = LocalSandboxBackend()
    try:  # the agent's own shell writes into the interpreter's site-packages
        plant = shell(f"echo 'import zz_agent' > {purelib}/zz_agent.pth")
        result = run_agent(backend, CALC, tmp_path, plant, env=env)
    finally:
        backend.close()
    assert result.outcome == "passed", (result.reason, result.error, result.test_output[-2000:])
    assert result.tests[F2P] == TestStatus.PASSED  # the unfixed F2P test, never run


AS_USER = """
import json, sys
sys.path[:0] = [TESTS, TESTS + "/support"]
import test_grader_forgery as t
from support.grading import grade_cases
import tempfile, pathlib
code = {"child-reads-memory": t.CHILD_READS_MEMORY, **{k: v[0] for k, v in t.ATTACKS.items()}}
results = grade_cases("bwrap", list(code), lambda backend, name: t.run_agent(
    backend, t.CALC, pathlib.Path(tempfile.mkdtemp()), t._init_with(code[name])))
out = {name: [r.outcome, r.reason, r.error or "", r.test_output[-4000:], str(r.tests.get(t.F2P))]
       for name, r in results.items()}
print("RESULT " + json.dumps(out))
"""


def test_as_a_non_root_user_on_bwrap(tmp_path: Path) -> None:
    """Every in-process attack of this file, and the child's memory read, as a throwaway
    non-root user (RLIMIT_NPROC in a user namespace, no cgroup): caught as they are as root."""
    if why_not():
        pytest.skip(why_not())
    from harness_gym.sandbox.bwrap import bwrap_available

    if not bwrap_available():
        pytest.skip("bubblewrap cannot run here")
    done = run_as_user(AS_USER.replace("TESTS", repr(str(Path(__file__).parent))), timeout=600)
    said = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert said, done.stderr[-3000:]
    out = json.loads(said[-1][len("RESULT "):])
    child = out.pop("child-reads-memory")
    assert "CHILD-READ: PermissionError" in child[3], child
    assert child[4] != "TestStatus.PASSED", child
    assert set(out) == set(ATTACKS)
    wrong = {name: got[:3] for name, got in out.items()
             if got[:2] != ["failed", "tampered"] or ATTACKS[name][1] not in got[2]
             or got[4] == "TestStatus.PASSED"}
    assert not wrong, wrong


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
