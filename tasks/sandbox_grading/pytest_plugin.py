"""The grader's pytest plugin: every test's outcome on the MAC'd channel, and tamper checks.

Loaded with `-p` before any conftest, test module or code under test is imported (see the
package doc). At import it claims a key, opens the channel and takes the `RunnerWatch`
baseline, all held by the engine (`engine.py`): no global of this module, no closure cell or
attribute the code under test can walk to holds the run; each hook function below only hands
its arguments to the engine, which checks who called it, and runs the `_Run` handler. Then,
for each test (in collection order, once each: a protocol or phase out of order is refused):

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
from _pytest.runner import CallInfo as _CallInfo

from .channel import open_channel
from .engine import code_objects, engine, quiet
from .files import defined_in, describe, inside, source_file, writable
from .guard import install as install_guard, no_memory_reads
from .run_records import RunRecords, grader_namespace, guarded
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
_RUNNER_DIRS = tuple(
    os.path.dirname(os.path.realpath(module.__file__)) + os.sep for module in (_pytest, pluggy)
)


class _TestState(object):
    """What one test did, phase by phase: each phase once per attempt. A new attempt (a rerun
    by pytest-rerunfailures or a conftest, all of it the runner's code: the engine checks the
    caller) starts with a setup once the last attempt's teardown was reported; the verdict is
    the last attempt's, as pytest's own is."""

    __slots__ = ("nodeid", "reports", "raised", "pyfunc", "origin", "seen", "attempts",
                 "subtests_failed")

    def __init__(self, nodeid):
        self.nodeid = nodeid
        self.attempts = 0
        self.attempt()

    def attempt(self):
        self.attempts += 1
        self.seen = set()  # (event, phase) pairs: each may come once an attempt
        self.reports = {}  # when -> (outcome, wasxfail)
        self.raised = {}  # when -> the exception type's name or None, seen by our phase wrapper
        self.pyfunc = False  # pytest_pyfunc_call reached for this test
        self.origin = None  # "file:line" that raised a skip/xfail
        self.subtests_failed = 0  # subtest reports made inside the call phase that failed


class _Run(RunRecords):
    # Slots: code under test cannot shadow a method on the instance (`_run.verdict = ...`).
    __slots__ = ("config", "registered", "hook_impls", "hook_lists", "hook_files", "states",
                 "snapshots", "function_runtest", "collecting", "items", "position", "nodeids",
                 "current", "outside_plugins", "trusted_code")

    def __init__(self, channel):
        # The base named, not super(): a module global is put back before each event, a
        # patched builtin only reported.
        RunRecords.__init__(self, channel, RunnerWatch(channel.workdir))
        self.config = None
        self.registered = set()  # ids of plugins seen through pytest_plugin_registered
        self.hook_impls = {}  # id(hookimpl) -> its function, for the critical hooks
        self.hook_lists = {}  # hook name -> last seen tuple of hookimpl ids
        self.hook_files = set()
        self.states = {}
        self.snapshots = {}  # nodeid -> (obj, code) of plain test functions
        self.function_runtest = getattr(pytest.Function, "runtest", None)
        self.collecting = False  # plugins registered from here on come from collected code
        self.items = None  # the collected items, in run order (pytest_collection_finish)
        self.position = 0  # index in `items` of the next protocol
        self.nodeids = {}  # id(item) -> its node id at collection (an item's may be rewritten)
        self.current = None  # the item whose protocol is open
        self.outside_plugins = []  # plugins installed outside the work tree, before any conftest
        self.trusted_code = None  # id -> code object of the runner's code, from the engine
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

    def check(self, where):
        RunRecords.check(self, where)
        self.check_hooks(where)

    # -- plugins and hooks -------------------------------------------------------------------

    def plugin_registered(self, plugin, manager, by_runner=True):
        self.registered.add(id(plugin))
        path = source_file(plugin)
        if path is None:
            return
        if not inside(path, self.workdir):
            if by_runner and self.trusted_code is None:  # installed, loaded at start-up
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
        if self.trusted_code is not None and id(code) not in self.trusted_code and not (
                path and inside(path, self.workdir)):  # fmt: skip
            self.tampered(
                "hooks", "%s gained an implementation that is neither the runner's nor in the "
                "work tree (%r from %s, seen at %s)"
                % (name, getattr(impl, "plugin_name", "?"), path, where)
            )
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
        self.channel.record(
            "test", id=state.nodeid, status=status, detail=detail, origin=state.origin,
            attempts=state.attempts,
        )

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
        if state.subtests_failed:  # pytest reports the test itself passed; its summary does not
            return "FAILED", "%d subtest(s) failed" % state.subtests_failed
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
                    % (state.nodeid, when, raised[when])
                )
                return "FAILED", "report contradicts the %s phase" % when
        if "call" not in raised:
            self.tampered("report", "%s passed without running its call phase" % state.nodeid)
            return "FAILED", "call phase never ran"
        if "runtest" in getattr(item, "__dict__", {}):
            self.tampered("item", "%s: item.runtest was replaced on the item" % state.nodeid)
            return "FAILED", "runtest replaced"
        plain = isinstance(item, pytest.Function) and type(item).runtest is self.function_runtest
        if plain and not state.pyfunc:
            self.tampered("item", "%s passed without its test function being called" % state.nodeid)
            return "FAILED", "test function never called"
        return "PASSED", None

    # -- the order of events ------------------------------------------------------------------

    def begin(self, item):
        """A protocol may only start for the next collected item, once, with none open."""
        if self.items is None or self.current is not None or self.position >= len(self.items) \
                or self.items[self.position] is not item:
            where = self.current.nodeid if self.current is not None else None
            self.tampered("sequence", "a test protocol for %r started out of order (open: %r)"
                          % (self.nodeids.get(id(item), getattr(item, "nodeid", "?")), where))
            return
        self.position += 1
        self.current = _TestState(self.nodeids[id(item)])
        self.states[id(item)] = self.current

    def state(self, item, event, when):
        """The open test's state for an event of `item`, or None (refused) when the event
        belongs to no open protocol of that item or came before."""
        state = self.states.get(id(item))
        if state is None or state is not self.current:
            self.tampered("sequence", "%s of %s for %r outside its test protocol"
                          % (event, when, self.nodeids.get(id(item), "?")))
            return None
        if (event, when) == ("phase", "setup") and ("report", "teardown") in state.seen:
            state.attempt()  # a rerun
        elif (event, when) in state.seen:
            self.tampered("sequence", "%s of %s for %s came twice" % (event, when, state.nodeid))
            state.reports[when] = ("failed", False)
            return None
        state.seen.add((event, when))
        return state

    def end(self, item):
        state = self.states.pop(id(item), None)
        if state is None or state is not self.current:
            return
        self.current = None
        self.check("end of " + state.nodeid)
        self.finish(item, state)

    # -- events (engine handlers: each runs once its caller is checked) ---------------------

    def on_plugin_registered(self, plugin, manager, by_runner):
        self.plugin_registered(plugin, manager, by_runner)
        if plugin is sys.modules.get(__name__) or not by_runner:
            return
        path = source_file(plugin)
        if self.trusted_code is None:
            if path is not None and not inside(path, self.workdir):
                self.outside_plugins.append(plugin)
        elif isinstance(plugin, type(sys)) and path is not None:
            self.trust_late(plugin, path)

    def trust_late(self, module, path):
        """A plugin module pytest itself registered after start-up: the task's conftest (its
        file is compared with the task's by the grader) or an installed plugin it names
        (`pytest_plugins = [...]`) from a file no sandbox user can write. Its functions become
        runner code (a conftest hook that re-runs tests calls pytest from its own frames)."""
        conftest = inside(path, self.workdir) and os.path.basename(path) == "conftest.py"
        if not conftest and (inside(path, self.workdir) or writable(path)):
            return
        real = os.path.realpath(path)
        values = [v for v in list(vars(module).values()) if defined_in(v, real)]
        found = code_objects(values, {})
        self.trusted_code.update(found)
        if not conftest:
            self.watch.trusted_files.add(path)

    def on_configure(self, config):
        self.config = config
        self.watch.extend()  # runner modules imported since (only trusted code has run so far)
        rootdir = getattr(config, "rootpath", None) or getattr(config, "rootdir", None)
        inifile = getattr(config, "inipath", None) or getattr(config, "inifile", None)
        self.channel.record(
            "config",
            rootdir=describe(str(rootdir), self.workdir)[0] if rootdir else None,
            inifile=describe(str(inifile), self.workdir) if inifile else None,
            args=[str(a) for a in getattr(config, "args", [])],
        )
        self.start_hook_watch(config)
        self.check("configure")

    def on_module(self, collector):
        path = getattr(collector, "path", None) or getattr(collector, "fspath", None)
        if path is not None and type(collector).__name__ != "DoctestModule":
            self.channel.record("module", file=describe(str(path), self.workdir))

    def on_collection(self):
        self.collecting = True

    def on_collection_finish(self, session):
        if self.items is not None:
            self.tampered("sequence", "the collection finished twice")
            return
        self.items = list(session.items)
        self.nodeids = dict((id(item), item.nodeid) for item in self.items)
        self.snapshot(self.items)
        self.channel.record("collected", count=len(self.items))
        self.check("collection end")

    def on_observe(self, item, when, outcome):
        if self.state(item, "phase", when) is not None:
            self.observe(item, when, outcome)

    def on_pyfunc_call(self, item):
        state = self.state(item, "pyfunc_call", "call")
        if state is None:
            return
        state.pyfunc = True
        expected = self.snapshots.get(state.nodeid)
        function = getattr(item, "obj", None)
        function = getattr(function, "__func__", function)
        code = getattr(function, "__code__", None)
        if expected is not None and (function is not expected[0] or code is not expected[1]):
            self.tampered(
                "item", "%s: the test function was replaced after collection" % state.nodeid
            )
            state.pyfunc = False

    def inside_call(self, item, by_runner):
        """Whether `item`'s call phase is running: a report made now is a subtest's (pytest 9
        makes them from inside the test, under unittest's `subTest` or the `subtests` fixture,
        so the caller's stack holds the test's own code)."""
        state = self.states.get(id(item))
        return state is not None and state is self.current and \
            ("report", "setup") in state.seen and ("phase", "call") not in state.seen

    def on_subtest_report(self, item, call, outcome, by_runner):
        """A report made inside the call phase, whoever made it: it can only fail the open test
        (code under test could fail its own test anyway), never pass one. Nothing of the
        caller's objects is run: exact types only, no attribute of theirs but CallInfo's."""
        state = self.current
        if state is None or self.states.get(id(item)) is not state:
            return
        if type(call) is not _CallInfo or call.excinfo is not None:
            state.subtests_failed += 1

    def on_before_report(self, item, when):
        self.check("%s of %s" % (when, self.nodeids.get(id(item), "?")))

    def on_after_report(self, item, call, outcome):
        state = self.state(item, "report", call.when)
        if state is None:
            return
        report = outcome.get_result()
        state.reports[call.when] = (report.outcome, hasattr(report, "wasxfail"))
        if getattr(call, "excinfo", None) is not None and report.outcome == "passed":
            self.tampered(
                "report", "%s: the %s phase raised %s but its report says passed"
                % (state.nodeid, call.when, call.excinfo.typename)
            )
            state.reports[call.when] = ("failed", False)

    def on_session_finish(self, session, exitstatus):
        self.check("session end")
        if self.current is not None:
            self.tampered("sequence", "the session ended inside the protocol of %s"
                          % self.current.nodeid)
        self.channel.record("end", exitstatus=int(exitstatus), failed=int(session.testsfailed))
        self.channel.close()


def _handlers(run, arm):
    """Each event's handler; a bug in one must not crash pytest, and is reported. `arm` (the
    guard's) is called by the engine, once the runner's code is fixed: nothing outside holds it."""
    names = ("plugin_registered", "configure", "module", "collection", "collection_finish",
             "begin", "end", "observe", "pyfunc_call", "before_report", "after_report",
             "inside_call", "subtest_report", "session_finish")  # fmt: skip
    methods = dict((n, getattr(run, "on_" + n, None) or getattr(run, n)) for n in names)
    handlers = dict((n, guarded(run, n, m)) for n, m in methods.items())
    handlers["outside_plugins"] = lambda: list(run.outside_plugins)
    handlers["workdir"] = lambda: run.workdir
    handlers["tracing"] = lambda hooks: setattr(run.watch, "tracing", hooks)

    def trusted(code, grader_code):
        run.trusted_code = code
        if arm is not None:
            arm(grader_code, code)

    handlers["trusted"] = trusted
    return handlers


def _start():
    """The engine's `send` (through `quiet`), or None when this process is not a grader's runner.
    Nothing of the run is kept anywhere but in the engine's frame (see `engine`)."""
    channel = open_channel()
    if channel is None:
        return None
    try:
        run = _Run(channel)
    except Exception as exc:  # noqa: BLE001
        channel.record("error", where="start", detail="%s: %s" % (type(exc).__name__, exc))
        return None
    no_memory_reads()
    arm, in_event = install_guard(lambda detail: run.tampered("introspection", detail),
                                  run.workdir, run.tracer)  # fmt: skip
    loop = engine(_handlers(run, arm), run.tampered,
                  exempt=("plugin_registered", "inside_call", "subtest_report"),
                  in_event=in_event)  # fmt: skip
    next(loop)
    return quiet(loop.send)


def _trust(send):
    """Fix which code is the runner's and arm the audit hook's seals: before any conftest or
    test module is imported (pluggy has read the hook functions' signatures by then)."""
    package, modules, classes = grader_namespace()
    plugins = send(("outside_plugins", ())) or []
    tops = set(
        (getattr(p, "__name__", None) if isinstance(p, type(sys)) else type(p).__module__) or ""
        for p in plugins
    )
    installed = tuple(sorted(set(t.split(".")[0] for t in tops if t)))
    tracers = tuple(n for n in ("coverage",) if n in sys.modules)  # pytest-cov's tracer
    prefixes = ("_pytest", "pytest", "pluggy") + installed + tracers + (package,)  # ours last
    send(("trust", (prefixes, modules, classes)))


_SEND = _start()
WORKDIR = None if _SEND is None else _SEND(("workdir", ()))  # not a secret: for entrypoints


# -- hooks: each hands its arguments to the engine; `_send` is a default, out of reach ----------


def pytest_plugin_registered(plugin, manager, _send=_SEND):
    if _send is not None:
        _send(("plugin_registered", (plugin, manager)))


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args, _send=_SEND):
    if _send is not None:
        _trust(_send)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config, _send=_SEND):
    if _send is not None:
        _trust(_send)  # a no-op when the conftests' hook came first
        _send(("configure", (config,)))


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_make_collect_report(collector, _send=_SEND):
    if _send is not None and isinstance(collector, pytest.Module):
        _send(("module", (collector,)))
    yield


@pytest.hookimpl(tryfirst=True)
def pytest_collection(session, _send=_SEND):
    if _send is not None:
        _send(("collection", ()))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session, _send=_SEND):
    if _send is not None:
        _send(("collection_finish", (session,)))


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem, _send=_SEND):
    if _send is not None:
        _send(("begin", (item,)))
    yield
    if _send is not None:
        _send(("end", (item,)))


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_setup(item, _send=_SEND):
    outcome = yield
    if _send is not None:
        _send(("observe", (item, "setup", outcome)))


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_call(item, _send=_SEND):
    outcome = yield
    if _send is not None:
        _send(("observe", (item, "call", outcome)))


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_teardown(item, _send=_SEND):
    outcome = yield
    if _send is not None:
        _send(("observe", (item, "teardown", outcome)))


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_pyfunc_call(pyfuncitem, _send=_SEND):
    if _send is not None:
        _send(("pyfunc_call", (pyfuncitem,)))
    yield


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call, _send=_SEND):
    inside = _send is not None and _send(("inside_call", (item,))) is True
    if _send is not None and not inside:
        _send(("before_report", (item, call.when)))
    outcome = yield
    if _send is not None:
        _send(("subtest_report" if inside else "after_report", (item, call, outcome)))


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_sessionfinish(session, exitstatus, _send=_SEND):
    yield
    if _send is not None:
        _send(("session_finish", (session, exitstatus)))


del _SEND
