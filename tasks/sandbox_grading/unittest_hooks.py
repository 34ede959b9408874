"""The grader's hooks for unittest and Django test runs (log parsers `unittest`, `django`).

unittest has no plugin system, so the shipped `sitecustomize` arms these hooks at interpreter
startup, before the runner or any code under test is imported: the process claims a key, and
`unittest.result.TestResult`'s outcome methods are wrapped so that every result class built on it
(TextTestResult, Django's runners, their parallel mode replaying workers' events in the parent)
reports to the channel. A `test` record is written at `stopTest` with the worst outcome the test
had (a failed subtest fails it); `start` and `end` frame each `startTestRun`/`stopTestRun`.

A process that claimed a key but never ran tests (a helper `python -c ...` in the test command)
writes `idle` at exit. A process that dies mid-run leaves its session without `end`: not a pass.
Tamper checks (`RunnerWatch` over `unittest.*` and the builtins) run after every test.
"""

import atexit
import os
import sys

from .channel import open_channel
from .guard import install as install_guard
from .files import describe
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


def test_id(test):
    """SWE-bench's unittest id, `test_x (pkg.mod.Class)`, as the log parser writes it."""
    name = getattr(test, "_testMethodName", None)
    if not isinstance(name, str):
        return str(test)
    cls = type(test)
    return "%s (%s.%s)" % (name, cls.__module__, getattr(cls, "__qualname__", cls.__name__))


class _Hooks(object):
    __slots__ = ("channel", "pid", "runs", "depth", "current", "modules", "fired", "watch")

    def __init__(self, channel):
        self.channel = channel
        self.pid = os.getpid()
        self.runs = 0  # test runs started
        self.depth = 0
        self.current = {}  # test id -> worst status so far
        self.modules = set()
        self.fired = set()
        self.watch = None

    def mine(self):
        return os.getpid() == self.pid  # not a forked worker's copy of the hooks

    def start_run(self):
        self.runs += 1
        self.depth += 1
        self.channel.record("start", runner="unittest", python=sys.version.split()[0], pid=self.pid)

    def stop_run(self):
        self.check("end of the test run")
        self.depth -= 1
        self.channel.record("end", exitstatus=0)

    def outcome(self, test, status):
        key = test_id(test)
        previous = self.current.get(key)
        if previous is None or _RANK[status] > _RANK[previous]:
            self.current[key] = status

    def stop_test(self, test):
        key = test_id(test)
        status = self.current.pop(key, None) or "ERROR"
        module = sys.modules.get(type(test).__module__)
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and path not in self.modules:
            self.modules.add(path)
            self.channel.record("module", file=describe(path, self.channel.workdir))
        self.check("end of " + key)
        self.channel.record("test", id=key, status=status, detail=None, origin=None)

    def check(self, where):
        for detail in self.watch.check() if self.watch is not None else ():
            if detail not in self.fired and len(self.fired) < 20:
                self.fired.add(detail)
                self.channel.record("tamper", check="runner", detail="%s (seen at %s)" % (detail, where))

    def at_exit(self):
        if self.mine() and self.runs == 0:
            self.channel.record("idle")


def _wrap(hooks, method, before=None, after=None):
    def wrapper(self, *args, **kwargs):
        if hooks.mine() and before is not None:
            before(*args)
        result = method(self, *args, **kwargs)
        if hooks.mine() and after is not None:
            after(*args)
        return result

    wrapper.__name__ = method.__name__
    wrapper.__doc__ = method.__doc__
    return wrapper


def arm():
    """Claim a key and wrap unittest's result methods; a no-op outside a grader's run."""
    channel = open_channel()
    if channel is None:
        return None
    import unittest.result

    result = unittest.result.TestResult
    hooks = _Hooks(channel)
    for name, status in _OUTCOMES.items():
        original = getattr(result, name)
        setattr(result, name, _wrap(hooks, original, before=lambda t, *a, s=status: hooks.outcome(t, s)))

    def subtest(test, subtest, error):
        if error is not None:
            failure = issubclass(error[0], test.failureException)
            hooks.outcome(test, "FAILED" if failure else "ERROR")

    result.addSubTest = _wrap(hooks, result.addSubTest, before=subtest)
    result.stopTest = _wrap(hooks, result.stopTest, after=hooks.stop_test)
    result.startTestRun = _wrap(hooks, result.startTestRun, before=hooks.start_run)
    result.stopTestRun = _wrap(hooks, result.stopTestRun, after=hooks.stop_run)
    hooks.watch = RunnerWatch(channel.workdir)  # after wrapping: the wrappers are the baseline
    for problem in hooks.watch.problems:
        channel.record("tamper", check="baseline", detail=problem)
    install_guard(lambda detail: channel.record("tamper", check="introspection", detail=detail))
    atexit.register(hooks.at_exit)
    return hooks
