"""The grader's pytest plugin: every test's outcome on the MAC'd channel, and tamper checks.

Loaded with `-p` before any conftest, test module or code under test is imported (see the
package doc). At import it claims a key, opens the channel and takes the `RunnerWatch`
baseline. Then, for each test:

- it wraps the test's protocol and each phase (outermost hook wrappers), so it sees what each
  phase really raised, independently of the report pytest builds from it;
- it runs the tamper checks right after each phase (before its report is built) and at the
  end of each test;
- after teardown it writes one `test` record with the test's status: PASSED only when setup,
  call and teardown all reported passed, the call was not an xfail, nothing was raised that the
  report hides, and (for plain test functions) the test function itself was called.

It also records what the grader must verify afterwards, because only the grader knows the task's
original files: the configuration file and rootdir, every plugin and conftest registered from
the work tree, every test module collected (with the blob id of the bytes read), the source files
of every implementation of an outcome-deciding hook, and where a skip/xfail was raised from.
The session's `end` record is written last; a session without one (os._exit, a crash, a kill)
never passes.
"""

import os
import sys

import _pytest
import pluggy
import pytest

from .channel import open_channel
from .guard import install as install_guard
from .files import describe, inside, source_file
from .watch import RunnerWatch

# Hooks whose implementations decide what a test's outcome is or which tests exist.
CRITICAL_HOOKS = (
    "pytest_runtestloop", "pytest_runtest_protocol", "pytest_runtest_setup",
    "pytest_runtest_call", "pytest_runtest_teardown", "pytest_runtest_makereport",
    "pytest_runtest_logreport", "pytest_report_teststatus", "pytest_pyfunc_call",
    "pytest_collect_file", "pytest_pycollect_makemodule", "pytest_pycollect_makeitem",
    "pytest_make_collect_report", "pytest_fixture_setup", "pytest_report_to_serializable",
    "pytest_report_from_serializable",
)  # fmt: skip
_MAX_TAMPER_RECORDS = 20
_RUNNER_DIRS = tuple(
    os.path.dirname(os.path.realpath(module.__file__)) + os.sep for module in (_pytest, pluggy)
)


class _TestState(object):
    """What one test did, phase by phase (the last attempt wins, for plugins that rerun)."""

    __slots__ = ("nodeid", "reports", "raised", "pyfunc", "origin")

    def __init__(self, nodeid):
        self.nodeid = nodeid
        self.reports = {}  # when -> (outcome, wasxfail)
        self.raised = {}  # when -> the exception type's name or None, seen by our phase wrapper
        self.pyfunc = False  # pytest_pyfunc_call reached for this test
        self.origin = None  # "file:line" that raised a skip/xfail


class _Run(object):
    # Slots: code under test cannot shadow a method on the instance (`_run.verdict = ...`).
    __slots__ = ("channel", "workdir", "watch", "config", "registered", "hook_impls",
                 "hook_lists", "hook_files", "states", "snapshots", "fired", "function_runtest",
                 "collecting")

    def __init__(self, channel):
        self.channel = channel
        self.workdir = channel.workdir
        self.watch = RunnerWatch(channel.workdir)
        self.config = None
        self.registered = set()  # ids of plugins seen through pytest_plugin_registered
        self.hook_impls = {}  # id(hookimpl) -> its function, for the critical hooks
        self.hook_lists = {}  # hook name -> last seen tuple of hookimpl ids
        self.hook_files = set()
        self.states = {}
        self.snapshots = {}  # nodeid -> (obj, code) of plain test functions
        self.fired = set()
        self.function_runtest = getattr(pytest.Function, "runtest", None)
        self.collecting = False  # plugins registered from here on come from collected code
        channel.record(
            "start",
            runner="pytest",
            version=pytest.__version__,
            python=sys.version.split()[0],
            pid=os.getpid(),
            files=[describe(m.__file__, self.workdir) for m in (pytest, _pytest, pluggy)],
        )
        for problem in self.watch.problems:
            self.tampered("baseline", problem)

    # -- records -----------------------------------------------------------------------------

    def tampered(self, check, detail):
        key = (check, detail)
        if key in self.fired or len(self.fired) >= _MAX_TAMPER_RECORDS:
            return
        self.fired.add(key)
        self.channel.record("tamper", check=check, detail=detail)

    def error(self, where, exc):
        self.channel.record("error", where=where, detail="%s: %s" % (type(exc).__name__, exc))

    def check(self, where):
        for detail in self.watch.check():
            self.tampered("runner", "%s (seen at %s)" % (detail, where))
        self.check_hooks(where)

    # -- plugins and hooks -------------------------------------------------------------------

    def plugin_registered(self, plugin, manager):
        self.registered.add(id(plugin))
        path = source_file(plugin)
        if path is None:
            return
        if not inside(path, self.workdir):
            self.watch.trusted_files.add(path)  # its patches of pytest are not an attack
            return
        name = manager.get_name(plugin) if hasattr(manager, "get_name") else None
        self.channel.record(
            "plugin", name=name, file=describe(path, self.workdir), late=self.collecting
        )

    def start_hook_watch(self, config):
        manager = config.pluginmanager
        relay = manager.hook  # pluggy's relay; config.hook may be a path-aware proxy of it
        for label, getter in (
            ("pluginmanager._hookexec", lambda: manager.__dict__.get("_hookexec")),
            ("pluginmanager._inner_hookexec", lambda: manager.__dict__.get("_inner_hookexec")),
            ("config.hook", lambda: config.__dict__.get("hook")),
        ):
            self.watch.watch_attribute(label, getter)
        for name in CRITICAL_HOOKS:
            caller = getattr(relay, name, None)
            if caller is None:
                continue
            self.watch.watch_attribute("hook " + name, lambda n=name: relay.__dict__[n])
            self.watch.watch_attribute(
                "hook %s._hookexec" % name, lambda c=caller: c.__dict__.get("_hookexec")
            )
        self.check_hooks("configure")

    def check_hooks(self, where):
        if self.config is None:
            return
        relay = self.config.pluginmanager.hook
        for name in CRITICAL_HOOKS:
            caller = relay.__dict__.get(name)
            if caller is None:
                continue
            impls = caller.get_hookimpls()
            ids = tuple(map(id, impls))
            if self.hook_lists.get(name) != ids:
                self.hook_lists[name] = ids
                for impl in impls:
                    if id(impl) not in self.hook_impls:
                        self.new_impl(name, impl, where)
            for impl in impls:
                if impl.function is not self.hook_impls.get(id(impl), impl.function):
                    self.tampered(
                        "hooks", "the %s implementation of %r was replaced (seen at %s)"
                        % (name, getattr(impl, "plugin_name", "?"), where)
                    )

    def new_impl(self, name, impl, where):
        self.hook_impls[id(impl)] = impl.function
        if id(impl.plugin) not in self.registered:
            self.tampered(
                "hooks", "%s gained an implementation from a plugin pytest never registered (%r, "
                "seen at %s)" % (name, getattr(impl, "plugin_name", "?"), where)
            )
        code = getattr(impl.function, "__code__", None)
        path = getattr(code, "co_filename", None)
        if path and path not in self.hook_files and inside(path, self.workdir):
            self.hook_files.add(path)
            self.channel.record("hookfile", hook=name, file=describe(path, self.workdir))

    # -- tests -------------------------------------------------------------------------------

    def snapshot(self, items):
        for item in items:
            obj = getattr(item, "__dict__", {}).get("_obj")
            function = getattr(obj, "__func__", obj)  # a method is bound anew for each test
            code = getattr(function, "__code__", None)
            if code is not None:
                self.snapshots[item.nodeid] = (function, code)

    def observe(self, item, when, outcome):
        state = self.states.get(id(item))
        if state is None:
            return
        excinfo = getattr(outcome, "excinfo", None)
        if excinfo is None:
            state.raised[when] = None
            return
        state.raised[when] = excinfo[0].__name__
        unittest = sys.modules.get("unittest")
        skips = (pytest.skip.Exception, getattr(unittest, "SkipTest", pytest.skip.Exception))
        if issubclass(excinfo[0], skips) or excinfo[0].__name__ == "XFailed":
            state.origin = self.raise_site(excinfo[2])

    def raise_site(self, tb):
        """The last frame outside pytest and pluggy: who called pytest.skip()/xfail()."""
        site = None
        while tb is not None:
            path = tb.tb_frame.f_code.co_filename
            if not os.path.realpath(path).startswith(_RUNNER_DIRS):
                site = (path, tb.tb_lineno)
            tb = tb.tb_next
        if site is None:
            return None
        where = describe(site[0], self.workdir)[0]
        return "%s:%d" % (where, site[1])

    def finish(self, item, state):
        status, detail = self.verdict(item, state)
        self.channel.record("test", id=item.nodeid, status=status, detail=detail, origin=state.origin)

    def verdict(self, item, state):
        reports, raised = state.reports, state.raised
        setup = reports.get("setup")
        if setup is None:
            return "ERROR", "no setup report"
        if setup[0] == "failed":
            return "ERROR", "setup failed"
        if setup[0] == "skipped":
            return ("XFAIL" if setup[1] else "SKIPPED"), "skipped in setup"
        call = reports.get("call")
        if call is None:
            return "ERROR", "no call report"
        if call[0] == "failed":
            return "FAILED", None
        if call[0] == "skipped":
            return ("XFAIL" if call[1] else "SKIPPED"), None
        if call[1]:
            return "XPASS", None
        teardown = reports.get("teardown")
        if teardown is None or teardown[0] != "passed":
            return "ERROR", "teardown failed" if teardown else "no teardown report"
        for when in ("setup", "call", "teardown"):
            if raised.get(when):
                self.tampered(
                    "report", "%s: the %s phase raised %s but its report says passed"
                    % (item.nodeid, when, raised[when])
                )
                return "FAILED", "report contradicts the %s phase" % when
        if "call" not in raised:
            self.tampered("report", "%s passed without running its call phase" % item.nodeid)
            return "FAILED", "call phase never ran"
        if "runtest" in getattr(item, "__dict__", {}):
            self.tampered("item", "%s: item.runtest was replaced on the item" % item.nodeid)
            return "FAILED", "runtest replaced"
        plain = isinstance(item, pytest.Function) and type(item).runtest is self.function_runtest
        if plain and not state.pyfunc:
            self.tampered("item", "%s passed without its test function being called" % item.nodeid)
            return "FAILED", "test function never called"
        return "PASSED", None


_run = None


def _guarded(where):
    """Run a hook body; a bug here must not crash pytest, and is reported to the grader."""

    def decorate(function):
        def wrapper(*args, **kwargs):
            if _run is None:
                return None
            try:
                return function(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001
                _run.error(where, exc)
                return None

        return wrapper

    return decorate


def _start():
    global _run
    channel = open_channel()
    if channel is None:
        return
    try:
        _run = _Run(channel)
    except Exception as exc:  # noqa: BLE001
        channel.record("error", where="start", detail="%s: %s" % (type(exc).__name__, exc))
        return
    run = _run  # the hook keeps the run, whatever later rebinds the global
    install_guard(lambda detail: run.tampered("introspection", detail))


_start()


# -- hooks ---------------------------------------------------------------------------------------


@_guarded("plugin_registered")
def _plugin_registered(plugin, manager):
    _run.plugin_registered(plugin, manager)


def pytest_plugin_registered(plugin, manager):
    _plugin_registered(plugin, manager)


@_guarded("configure")
def _configure(config):
    _run.config = config
    _run.watch.extend()  # runner modules imported since (only trusted code has run so far)
    rootdir = getattr(config, "rootpath", None) or getattr(config, "rootdir", None)
    inifile = getattr(config, "inipath", None) or getattr(config, "inifile", None)
    _run.channel.record(
        "config",
        rootdir=describe(str(rootdir), _run.workdir)[0] if rootdir else None,
        inifile=describe(str(inifile), _run.workdir) if inifile else None,
        args=[str(a) for a in getattr(config, "args", [])],
    )
    _run.start_hook_watch(config)
    _run.check("configure")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    _configure(config)


@_guarded("collect")
def _collected_module(collector):
    path = getattr(collector, "path", None) or getattr(collector, "fspath", None)
    if path is not None and type(collector).__name__ != "DoctestModule":
        _run.channel.record("module", file=describe(str(path), _run.workdir))


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_make_collect_report(collector):
    if isinstance(collector, pytest.Module):
        _collected_module(collector)
    yield


@_guarded("collection")
def _collection_start():
    _run.collecting = True


@pytest.hookimpl(tryfirst=True)
def pytest_collection(session):
    _collection_start()


@_guarded("collection_finish")
def _collection_finish(session):
    _run.snapshot(session.items)
    _run.channel.record("collected", count=len(session.items))
    _run.check("collection end")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session):
    _collection_finish(session)


@_guarded("protocol")
def _begin(item):
    _run.states[id(item)] = _TestState(item.nodeid)


@_guarded("protocol")
def _end(item):
    state = _run.states.pop(id(item), None)
    if state is not None:
        _run.check("end of " + item.nodeid)
        _run.finish(item, state)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    _begin(item)
    yield
    _end(item)


@_guarded("phase")
def _observe(item, when, outcome):
    _run.observe(item, when, outcome)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_setup(item):
    outcome = yield
    _observe(item, "setup", outcome)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_call(item):
    outcome = yield
    _observe(item, "call", outcome)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_teardown(item):
    outcome = yield
    _observe(item, "teardown", outcome)


@_guarded("pyfunc_call")
def _pyfunc_call(item):
    state = _run.states.get(id(item))
    if state is None:
        return
    state.pyfunc = True
    expected = _run.snapshots.get(item.nodeid)
    function = getattr(item, "obj", None)
    function = getattr(function, "__func__", function)
    code = getattr(function, "__code__", None)
    if expected is not None and (function is not expected[0] or code is not expected[1]):
        _run.tampered("item", "%s: the test function was replaced after collection" % item.nodeid)
        state.pyfunc = False


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    _pyfunc_call(pyfuncitem)
    yield


@_guarded("makereport")
def _before_report(item, when):
    _run.check("%s of %s" % (when, item.nodeid))


@_guarded("makereport")
def _after_report(item, call, outcome):
    state = _run.states.get(id(item))
    report = outcome.get_result()
    if state is not None:
        state.reports[call.when] = (report.outcome, hasattr(report, "wasxfail"))
        if getattr(call, "excinfo", None) is not None and report.outcome == "passed":
            _run.tampered(
                "report", "%s: the %s phase raised %s but its report says passed"
                % (item.nodeid, call.when, call.excinfo.typename)
            )
            state.reports[call.when] = ("failed", False)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    _before_report(item, call.when)
    outcome = yield
    _after_report(item, call, outcome)


@_guarded("sessionfinish")
def _session_finish(session, exitstatus):
    _run.check("session end")
    _run.channel.record("end", exitstatus=int(exitstatus), failed=int(session.testsfailed))
    _run.channel.close()


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    yield
    _session_finish(session, exitstatus)
