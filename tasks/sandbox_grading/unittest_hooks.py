"""The grader's hooks for unittest and Django test runs (log parsers `unittest`, `django`).

unittest has no plugin system, so the shipped `sitecustomize` arms these hooks at interpreter
startup, before the runner or any code under test is imported: the process claims a key, and
`unittest.result.TestResult`'s methods are wrapped so that every result class built on it
(TextTestResult, Django's) reports. A `test` record is written at `stopTest` with the worst
outcome the test had (a failed subtest fails it); `start` and `end` frame each outermost
`startTestRun`/`stopTestRun`.

As on the pytest path (`engine.py`), nothing the code under test reaches by attribute walks
holds the run: the channel, its key and every test's state are locals of the engine's frame;
the wrappers hold only the engine's `send` (a default argument, whose read the audit hook
refuses); the process is non-dumpable, so a child that is not Python (no audit hook) cannot
open its memory. Each event is checked before the engine acts (`_caller_problem`): on the main
thread, in the runner's pid, called by unittest itself (the first frame below the result's own methods
is unittest's code, by code identity; the result's methods in between are unittest's or, from
the work tree, reported for the grader to compare with the task's files), on the result of the
outermost run (a test that runs a suite of its own into another result reports nothing), for
the test that is running (startTest, outcomes, stopTest in that order, one test at a time), on
a result whose class and instance dict still have the methods the run started with. Each
refusal is a `tamper` record.

A process that claimed a key but never ran tests (a helper `python -c ...` in the test command)
writes `idle` at exit. A process that dies mid-run leaves its session without `end`: not a pass.
Tamper checks (`RunnerWatch` over `unittest.*` and the builtins) run at the end of every test.
A forked copy (Django's parallel workers) reports nothing: its wrappers skip the engine; events
Django replays in the parent come from Django's code, not unittest's, and are refused.
"""

import atexit
import os
import sys

from .channel import open_channel
from .engine import engine, quiet
from .files import describe, inside
from .guard import install as install_guard
from .guard import no_memory_reads
from .run_records import RunRecords, grader_namespace, guarded
from .watch import RunnerWatch

_RANK = {"PASSED": 0, "SKIPPED": 1, "XFAIL": 2, "XPASS": 3, "FAILED": 4, "ERROR": 5}
_OUTCOMES = {
    "addSuccess": "PASSED",
    "addFailure": "FAILED",
    "addError": "ERROR",
    "addSkip": "SKIPPED",
    "addExpectedFailure": "XFAIL",
    "addUnexpectedSuccess": "XPASS",
}
_FRAMING = ("startTestRun", "stopTestRun", "startTest", "stopTest", "addSubTest")
_METHODS = tuple(_OUTCOMES) + _FRAMING


def test_id(test):
    """SWE-bench's unittest id, `test_x (pkg.mod.Class)`, as the log parser writes it."""
    name = getattr(test, "_testMethodName", None)
    if not isinstance(name, str):
        return str(test)
    cls = type(test)
    return "%s (%s.%s)" % (name, cls.__module__, getattr(cls, "__qualname__", cls.__name__))


class _Run(RunRecords):
    """The run's state; only the engine's frame holds it. Its watch is taken in `arm`."""

    __slots__ = ("pid", "runs", "result", "result_type", "depth", "current", "status", "modules",
                 "hookfiles", "test_methods")

    def __init__(self, channel):
        RunRecords.__init__(self, channel)
        self.pid = os.getpid()
        self.runs = 0  # outermost test runs started
        self.result = None  # the result of the open outermost run
        self.result_type = None
        self.depth = 0  # nested startTestRun calls (a test running a suite of its own)
        self.current = None  # the running test
        self.status = None  # its worst outcome so far
        self.modules = set()
        self.hookfiles = set()
        self.test_methods = None  # names of unittest.TestCase's methods

    def hookfile(self, path):
        if path not in self.hookfiles:
            self.hookfiles.add(path)
            self.channel.record("hookfile", hook="unittest result",
                                file=describe(path, self.workdir))

    def ours(self, result):
        """Whether `result` is the open run's; a changed one is reported."""
        if result is not self.result or result is None:
            return False
        if type(result) is not self.result_type:
            self.tampered("result", "the test result's class was changed to %r" % type(result))
        shadowed = [n for n in _METHODS if n in (getattr(result, "__dict__", None) or {})]
        if shadowed:
            self.tampered("result", "the test result's %s was replaced on the instance"
                          % ", ".join(shadowed))  # fmt: skip
        return True

    # -- events (engine handlers: each runs once its caller is checked) ---------------------

    def on_start_run(self, result):
        self.depth += 1
        if self.depth > 1:  # a run inside a test, into a result of its own
            return
        self.runs += 1
        self.result, self.result_type = result, type(result)
        self.channel.record("start", runner="unittest", python=sys.version.split()[0], pid=self.pid)

    def on_stop_run(self, result):
        self.depth = max(0, self.depth - 1)
        if not self.ours(result):
            return
        if self.current is not None:
            self.tampered("sequence", "the test run ended inside %s" % test_id(self.current))
        self.check("end of the test run")
        self.result = None
        self.channel.record("end", exitstatus=0)

    def on_start_test(self, result, test):
        if not self.ours(result):
            return
        if self.current is not None:
            self.tampered("sequence", "%s started while %s was running"
                          % (test_id(test), test_id(self.current)))  # fmt: skip
            return
        self.current, self.status = test, None

    def on_outcome(self, result, test, status):
        # Outcomes of no running test (a class or module fixture's error holder) name no test.
        if self.ours(result) and test is self.current and test is not None:
            if self.status is None or _RANK[status] > _RANK[self.status]:
                self.status = status

    def on_sub_test(self, result, test, subtest, error):
        if error is not None and self.ours(result) and test is self.current:
            failure = issubclass(error[0], test.failureException)
            self.on_outcome(result, test, "FAILED" if failure else "ERROR")

    def on_stop_test(self, result, test):
        if not self.ours(result):
            return
        key = test_id(test)
        if test is not self.current:
            self.tampered("sequence", "stopTest of %s, which is not the running test" % key)
            return
        status, self.current, self.status = self.status or "ERROR", None, None
        module = sys.modules.get(type(test).__module__)
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and path not in self.modules:
            self.modules.add(path)
            self.channel.record("module", file=describe(path, self.workdir))
        shadowed = [n for n, v in list((getattr(test, "__dict__", None) or {}).items())
                    if n in self.test_methods and callable(v)]  # fmt: skip
        if shadowed:
            self.tampered("test", "%s: the test's %s replaced on its instance"
                          % (key, ", ".join(sorted(shadowed)[:3])))  # fmt: skip
            status = "FAILED"
        self.check("end of " + key)
        self.channel.record("test", id=key, status=status, detail=None, origin=None)

    def on_exit(self):
        if self.runs == 0:
            self.channel.record("idle")


def _caller_check(run):
    """The engine's check for unittest's events (see the module doc); `run` gets the work-tree
    files of result methods on the way. Only the engine holds the function."""
    import _thread

    get_ident, getpid, getframe = _thread.get_ident, os.getpid, sys._getframe

    def problem(trusted, entry, main, pid, skip, name, args):
        if get_ident() != main:
            return "a grader hook was called outside the runner's main thread"
        if getpid() != pid:
            return "a grader hook was called in a forked copy of the runner (pid %d)" % getpid()
        if name == "exit":
            return None
        result = args[0]
        frame = getframe(skip + 1)
        while frame is not None:
            code = frame.f_code
            names = code.co_varnames[:1] if code.co_argcount else ()
            if not names or frame.f_locals.get(names[0]) is not result:
                break  # the dispatcher: below the result's own methods
            if id(code) not in trusted:
                path = code.co_filename or ""
                if not inside(path, run.workdir):
                    return "a test result method from outside the runner and the work tree " \
                           "(%s:%d) called a grader hook" % (path, code.co_firstlineno)
                run.hookfile(path)
            frame = frame.f_back
        if frame is None or id(frame.f_code) not in trusted:
            where = "nothing" if frame is None else "%s (%s:%d)" % (
                frame.f_code.co_name, frame.f_code.co_filename, frame.f_code.co_firstlineno)
            return "the test result's %s was called by %s, not by unittest" % (name, where)
        return None

    return problem


def _wrap(send, name, method, pid):
    """`method` of TestResult, reporting `name` to the engine first (or after, for stopTest and
    stopTestRun). Holds nothing but defaults; a forked copy's calls skip the engine."""
    if name in ("stopTest", "stopTestRun"):

        def after(self, *args, _send=send, _name=name, _method=method, _pid=pid, _getpid=os.getpid,
                  **kwargs):  # fmt: skip
            value = _method(self, *args, **kwargs)
            if _getpid() == _pid:
                _send((_name, (self,) + args))
            return value

        wrapper = after
    else:

        def before(self, *args, _send=send, _name=name, _method=method, _pid=pid,
                   _getpid=os.getpid, **kwargs):  # fmt: skip
            if _getpid() == _pid:
                _send((_name, (self,) + args))
            return _method(self, *args, **kwargs)

        wrapper = before
    wrapper.__name__ = method.__name__
    wrapper.__qualname__ = getattr(method, "__qualname__", method.__name__)
    wrapper.__doc__ = method.__doc__
    return wrapper


def _handlers(run, arm):
    handlers = {
        "startTestRun": guarded(run, "startTestRun", run.on_start_run),
        "stopTestRun": guarded(run, "stopTestRun", run.on_stop_run),
        "startTest": guarded(run, "startTest", run.on_start_test),
        "stopTest": guarded(run, "stopTest", run.on_stop_test),
        "addSubTest": guarded(run, "addSubTest", run.on_sub_test),
        "exit": guarded(run, "exit", run.on_exit),
    }
    for name, status in _OUTCOMES.items():
        handlers[name] = guarded(run, name, lambda result, test, *rest, s=status: run.on_outcome(
            result, test, s))  # fmt: skip

    def tracing(hooks):
        if run.watch is not None:
            run.watch.tracing = hooks

    def trusted(code, grader_code):
        for seal in arm:  # the guard's, installed by then
            seal(grader_code, code)

    handlers["tracing"] = tracing
    handlers["trusted"] = trusted
    return handlers


def arm():
    """Claim a key and wrap unittest's result methods; a no-op outside a grader's run. Returns
    True when armed (nothing of the run: that stays in the engine)."""
    channel = open_channel()
    if channel is None:
        return False
    import unittest
    import unittest.result

    run = _Run(channel)
    run.test_methods = frozenset(
        n for n, v in vars(unittest.TestCase).items() if callable(v) and not n.startswith("__"))
    in_event, seal = [], []
    loop = engine(_handlers(run, seal), run.tampered, in_event=in_event, check=_caller_check(run))
    next(loop)
    send = quiet(loop.send)
    result = unittest.result.TestResult
    for name in _METHODS:
        setattr(result, name, _wrap(send, name, getattr(result, name), run.pid))
    run.watch = RunnerWatch(channel.workdir)  # after wrapping: the wrappers are the baseline
    for problem in run.watch.problems:
        run.tampered("baseline", problem)
    no_memory_reads()  # before the guard, which refuses the ctypes call it makes
    guard, _ = install_guard(lambda detail: run.tampered("introspection", detail), run.workdir,
                             run.tracer, in_event)  # fmt: skip
    if guard is not None:
        seal.append(guard)
    package, modules, classes = grader_namespace()
    send(("trust", (("unittest", package), modules, classes)))

    def at_exit(_send=send, _pid=run.pid, _getpid=os.getpid):
        if _getpid() == _pid:
            _send(("exit", ()))

    atexit.register(at_exit)
    return True
