"""An audit hook (Python 3.8+), installed by the grader's plugin at import, before any conftest,
test module or code under test: the generic ways in-process code could reach the grader's key
or state by introspection are refused, and each refusal is a `tamper` record written at once,
before the refused call returns, so catching the exception does not hide it.

Refused: walks of the object graph (`gc.get_objects`, `gc.get_referrers`, `gc.get_referents`),
every thread's frames (`sys._current_frames`), the frame of a suspended grader generator (its
hook wrappers and the engine that holds the run's state: `gi_frame`/`cr_frame`/`ag_frame` of
grader code), ctypes' reads and calls (`string_at`, `from_address`, foreign calls, `pythonapi`
symbols: raw memory), opening a process's memory (`/proc/PID/mem`), importing CPython's test
modules that read raw memory, reading the defaults of a grader hook function (where its link to
the engine is: `engine.py`) and replacing a grader function's code or defaults. `import ctypes`
and loading a library stay allowed. An audit hook cannot be removed once added, and this one
reads nothing from module globals at call time.

Plain attribute walks through pytest's objects reach the plugin's module and its functions
(no audit event marks them); they find nothing there that writes a record or holds a verdict.
"""

import os
import sys
import types

_GRAPH = frozenset(("gc.get_objects", "gc.get_referrers", "gc.get_referents",
                    "sys._current_frames"))  # fmt: skip
_FRAME_ATTRS = frozenset(("gi_frame", "cr_frame", "ag_frame"))
_SEALED = frozenset(("__code__", "__defaults__", "__kwdefaults__"))  # no writes to grader functions
_DEFAULTS = frozenset(("__defaults__", "__kwdefaults__"))  # no reads either, once armed
_RAW_MODULES = frozenset(("_testcapi", "_testinternalcapi", "_testmultiphase", "_ctypes_test"))
_CTYPES_OK = frozenset(("ctypes.dlopen",))
_TRACERS = frozenset(("sys.settrace", "sys.setprofile"))
_MONITORING = frozenset(("sys.monitoring.register_callback",))
_HERE = os.path.dirname(os.path.realpath(__file__)) + os.sep
_FUNCTION = type(lambda: None)
_GENERATOR, _COROUTINE, _ASYNC_GENERATOR = types.GeneratorType, types.CoroutineType, \
    types.AsyncGeneratorType  # what has a gi_/cr_/ag_frame: a forged event names anything
_getframe = sys._getframe
_fsdecode = os.fsdecode
_realpath = os.path.realpath


def _memory_file(path, _fsdecode=_fsdecode, _realpath=_realpath, _type=type):
    """Whether `path` (of an `open` event) names a process's memory: /proc/PID/mem (also a
    relative `mem`, which a dir_fd of /proc/PID would resolve), /dev/mem, /dev/kmem. Anything
    but str and bytes counts as one: `os.fspath` would run the object's own `__fspath__` inside
    this hook, where a frame walk reaches the hook's closure (`builtins.open` and pathlib hand
    over str; only `os.open(obj)` gets here with an object). Types are compared by identity:
    `in (str, bytes)` would call a metaclass's `__eq__`, the caller's code, inside the hook."""
    kind = _type(path)
    if kind is int:
        return False
    if kind is not str and kind is not bytes:
        return True
    try:
        text = _fsdecode(path)
    except (TypeError, ValueError):
        return False
    tail = text.rstrip("/").rpartition("/")[2]
    if tail in ("kmem",) or text in ("/dev/mem", "/dev/kmem"):
        return True
    if tail != "mem":
        return False
    return not text.startswith("/") or _realpath(text).startswith("/proc/")


def _installer(frame, workdir, _realpath=_realpath, _type=type):
    """(file, line) of the frame nearest the top of the stack that lies in the work tree: who
    installs a trace or profile function (a test file, a conftest, or the code under test, which
    the grader tells apart), or None when only installed code is on the stack (pytest-cov)."""
    while frame is not None:
        path = frame.f_code.co_filename or ""
        if _type(path) is not str:  # a str subclass's methods would run in the hook
            return "<a file name that is not a str>", frame.f_lineno
        if path.startswith("<"):  # exec()'d or frozen: its caller says who
            pass
        elif path.startswith(workdir + "/") or _realpath(path).startswith(workdir + "/"):
            return path, frame.f_lineno
        frame = frame.f_back
    return None


def install(on_refused, workdir="/nonexistent", on_tracer=None, in_event=None):
    """Add the hook; `on_refused(detail)` records a refusal. Returns `(arm, in_event)`, or
    (None, None) where audit hooks do not exist (Python < 3.8). `arm(grader_code, runner_code)`
    (code ids), called once pluggy has read the grader's hook functions: from then on their
    defaults are not readable, refused calls made directly by grader code pass (the watch's own
    `gc`), `sys.monitoring` callbacks may be registered by runner code only, and each
    `sys.settrace`/`sys.setprofile` from outside the runner goes to `on_tracer(file, line)`
    with the work-tree frame that made it (see `_installer`; the grader refuses one made by
    the code under test). A trace or profile function never sees the engine's frame: the
    hook functions turn them off while they hand an event over (`engine.quiet`), and none may
    be installed while an event is handled. `in_event`, a list the engine keeps non-empty while
    it handles an event (the one given, or a new one): meanwhile no frame may be taken
    (`sys._getframe`, a traceback's `tb_frame`) but by grader code, so code the grader calls
    into (a `__repr__`, a property) cannot walk back to the engine's frame."""
    add = getattr(sys, "addaudithook", None)
    if add is None:
        return None, None
    busy = []  # the hook's own attribute reads raise events too: not re-entered
    armed = []  # [grader code ids, runner code ids] once armed
    in_event = [] if in_event is None else in_event  # non-empty in an event (engine.py)

    def refuse(detail):
        busy.append(1)
        try:
            on_refused(detail)
        finally:
            busy.pop()
        raise RuntimeError("refused by the grader: %s" % detail)

    def grader_function(obj, _function=_FUNCTION, _type=type, _here=_HERE):
        if _type(obj) is not _function:
            return False
        busy.append(1)
        try:
            return (obj.__code__.co_filename or "").startswith(_here)
        finally:
            busy.pop()

    def from_grader(which=0, _getframe=_getframe, _id=id):
        """Whether the code that raised the event is the grader's own (`which` 0), or the
        runner's or the grader's (1), by code identity."""
        if not armed:
            return False
        busy.append(1)
        try:
            code = _id(_getframe(2).f_code)  # 0: this, 1: the hook
            return code in armed[0] or (which == 1 and code in armed[1])
        finally:
            busy.pop()

    # Everything the hook uses is a local or a default argument: a module global could be
    # rebound by the code under test (`guard._GRAPH = frozenset()`), a default cannot. An
    # argument is hashed or compared only once its type is exactly str: a subclass's `__hash__`
    # or `__eq__` (an import's name, or any argument of a `sys.audit` call the code under test
    # makes itself) would run here and could take this frame.
    def hook(event, args, _graph=_GRAPH, _ctypes_ok=_CTYPES_OK, _frames=_FRAME_ATTRS,
             _defaults=_DEFAULTS, _sealed=_SEALED, _raw=_RAW_MODULES, _here=_HERE,
             _realpath=_realpath, _memory_file=_memory_file, _getattr=getattr,
             _len=len, _tracers=_TRACERS, _monitoring=_MONITORING, _installer=_installer,
             _workdir=workdir, _on_tracer=on_tracer, _getframe=_getframe, _type=type,
             _gen=_GENERATOR, _coro=_COROUTINE, _agen=_ASYNC_GENERATOR):  # fmt: skip
        if busy:
            return
        if event in _graph:
            if not from_grader():
                refuse("%s() called while the grader runs (an object-graph or frame walk)" % event)
        elif event in _tracers:
            if in_event and not from_grader(1):
                refuse("%s() called while the grader handles an event (the function would be "
                       "handed the grader's frames)" % event)  # fmt: skip
            elif armed and _on_tracer is not None and not from_grader(1):
                busy.append(1)
                try:
                    site = _installer(_getframe(1), _workdir)
                    if site is not None:
                        _on_tracer(site[0], site[1])
                finally:
                    busy.pop()
        elif event in _monitoring:
            if armed and not from_grader(1):
                refuse("%s() called by code that is not the runner's (a monitoring callback "
                       "can take any frame, the grader's too)" % event)  # fmt: skip
        elif armed and in_event and (event == "sys._getframe" or (
                event == "object.__getattr__" and _len(args) == 2 and _type(args[1]) is str
                and args[1] == "tb_frame")):
            if not from_grader():
                refuse("a frame taken while the grader handles an event (%s): from code the "
                       "grader called, walking back to the grader's" % event)  # fmt: skip
        elif event.startswith("ctypes.") and event not in _ctypes_ok:
            refuse("%s: ctypes memory access while the grader runs" % event)
        elif event in ("object.__getattr__", "object.__setattr__") and (
                _len(args) < 2 or _type(args[1]) is not str):
            pass  # only a forged event (`sys.audit`) names an attribute with something else
        elif event == "object.__getattr__" and _len(args) == 2 and args[1] in _frames:
            owner = _type(args[0])
            if owner is not _gen and owner is not _coro and owner is not _agen:
                return  # forged (`sys.audit`): its object's own `__getattr__` must not run here
            busy.append(1)
            try:
                code = _getattr(args[0], args[1][:2] + "_code", None)
                filename = _getattr(code, "co_filename", "") or ""
                ours = _realpath(filename).startswith(_here)
            finally:
                busy.pop()
            if ours:
                refuse("%s of the grader's own %s read (a frame walk into the grader)"
                       % (args[1], _getattr(code, "co_name", "?")))  # fmt: skip
        elif event == "object.__getattr__" and _len(args) == 2 and args[1] in _defaults:
            if armed and grader_function(args[0]):
                refuse("%s of a grader hook read (where its link to the grader's state is)"
                       % args[1])  # fmt: skip
        elif event == "object.__setattr__" and _len(args) >= 2 and args[1] in _sealed:
            if grader_function(args[0]):
                refuse("%s of a grader function replaced" % args[1])
        elif event == "open" and args:
            busy.append(1)
            try:
                memory = _memory_file(args[0])
            finally:
                busy.pop()
            if memory and _type(args[0]) is not str and _type(args[0]) is not bytes:
                # No repr, no type name: either would run the object's (or its metaclass's) code
                # here, which could take this frame and raise before the refusal is recorded.
                refuse("open() of a path object that is not str or bytes (its own code would "
                       "run inside the grader's audit hook), while the grader runs")
            elif memory:
                refuse("open(%r): reading a process's memory while the grader runs" % (args[0],))
        elif event == "import" and args and _type(args[0]) is not str:
            refuse("import of a module name that is not a str (its own code would run inside "
                   "the grader's audit hook), while the grader runs")
        elif event == "import" and args and args[0] in _raw:
            refuse("import %s: a module that reads raw memory, while the grader runs" % args[0])

    def arm(grader_code, runner_code):
        if not armed:
            armed.append(frozenset(grader_code))
            armed.append(frozenset(runner_code))

    add(hook)
    return arm, in_event


def no_memory_reads():
    """Make this process non-dumpable: another process of the same user (one the code under
    test starts, without this audit hook) can then neither ptrace it nor read /proc/PID/mem."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
    except Exception:  # noqa: BLE001 - no libc prctl: nothing more to do
        pass
