"""Where the grader's in-process state lives: the frame of a suspended generator.

The code under test shares the runner's interpreter, and plain attribute walks are no audit
event: from `request.config.pluginmanager` it reaches the grader's plugin module, and from
there every module global, closure cell and object attribute. So none of those holds anything
that writes a record or decides a verdict. The run's state (the channel and its key, the watch,
every test's phases) is a local of `engine()`'s frame, which only `gi_frame`, `gc`, `ctypes` and
frame walks reach, all refused by the audit hook (`guard.py`); the plugin's hook functions hold
the engine's `send` as a default argument, whose reads (`__defaults__`) the hook refuses too.

What is left is calling: the code under test can call the plugin's hook functions, or drive
pytest's own machinery (`item.ihook.pytest_runtest_protocol(...)`) so pytest calls them. So each
event is checked before the engine acts on it:

- the caller: the main thread, the runner's own pid (not a forked copy), and every frame on
  the stack is code of the runner (pytest, pluggy, this package, installed plugins registered
  before any conftest), identified by code object (a `compile()`d fake with pytest's file name
  is not one), above exactly the interpreter's entry frames seen at import. A hook called from
  a test, a conftest, a thread, a `weakref.finalize` callback or any other code is refused.
- the grader's own code: every global of this package's modules and every attribute of their
  classes are the objects seen when the runner's code was fixed (before any conftest); a
  replaced, added or deleted one is put back before and after each event, then reported. (The
  standard library they call is not: tests monkeypatch it; `builtins` is RunnerWatch's.)

Each refusal is a `tamper` record (the verdict is then `tampered`). The order of events (one
protocol per collected item, in order, each phase once) is the plugin's (`pytest_plugin.py`).
"""

import _thread
import os
import sys
import types

_FUNCTION = types.FunctionType
_CODE = types.CodeType
_getframe = sys._getframe
_get_ident = _thread.get_ident
_getpid = os.getpid
_setattr = setattr
_id = id
_isinstance = isinstance
_len = len
_list = list
_getattr = getattr


def code_objects(values, found):
    """Add to `found` (a dict id -> code object, kept alive) every code object of the functions,
    methods, properties and classes among `values`, with the code nested in them."""
    stack = _list(values)
    seen = set()
    while stack:
        value = stack.pop()
        if _id(value) in seen:
            continue
        seen.add(_id(value))
        if _isinstance(value, _CODE):
            found[_id(value)] = value
            stack.extend(c for c in value.co_consts if _isinstance(c, _CODE))
        elif _isinstance(value, _FUNCTION):
            stack.append(value.__code__)
            wrapped = _getattr(value, "__wrapped__", None)
            if wrapped is not None:
                stack.append(wrapped)
        elif _isinstance(value, (staticmethod, classmethod, types.MethodType)):
            stack.append(value.__func__)
        elif _isinstance(value, property):
            stack.extend(f for f in (value.fget, value.fset, value.fdel) if f is not None)
        elif _isinstance(value, type):
            stack.extend(_list(value.__dict__.values()))
    return found


def _ours(value, prefixes):
    module = _getattr(value, "__module__", None)
    return _isinstance(module, str) and module.split(".")[0] in prefixes


def module_code(modules, prefixes):
    """Every code object of the functions and classes that `modules` define (their
    `__module__` starts with one of `prefixes`; not what they import from the stdlib)."""
    found = {}
    for module in modules:
        mapping = _getattr(module, "__dict__", None)
        if _isinstance(mapping, dict):
            code_objects([v for v in _list(mapping.values()) if _ours(v, prefixes)], found)
    return found


def _stack(skip):
    frame = _getframe(skip + 1)
    codes = []
    while frame is not None:
        codes.append(frame.f_code)
        frame = frame.f_back
    return codes


def _entry(codes, trusted):
    """The code objects below the lowest runner frame (the interpreter's entry: runpy, a
    console script's module), as ids, bottom last."""
    lowest = max([i for i, code in enumerate(codes) if _id(code) in trusted] or [-1])
    return tuple(_id(code) for code in codes[lowest + 1:])


class _Snapshot(object):
    """The grader's own namespaces (its modules' globals, its classes' attributes), by
    identity."""

    __slots__ = ("entries", "keys")

    def __init__(self, modules, classes):
        self.entries = []  # (owner, is_class, name, value)
        self.keys = []  # (owner, is_class, names)
        owners = [(m.__dict__, False) for m in modules] + [(c, True) for c in classes]
        for owner, is_class in owners:
            mapping = owner.__dict__ if is_class else owner
            for name, value in _list(mapping.items()):
                self.entries.append((owner, is_class, name, value))
            self.keys.append((owner, is_class, frozenset(mapping)))


def _restore(snapshot, _setattr=setattr, _delattr=delattr, _len=len, _list=list,
             _registry="__warningregistry__"):  # fmt: skip
    """Put back every changed entry; (owner, name) of what had changed. Everything it calls is a
    default argument: bound at import, out of reach of a patched global (the audit hook refuses
    reads and writes of a grader function's defaults and code)."""
    changed = []
    for owner, is_class, name, value in snapshot.entries:
        mapping = owner.__dict__ if is_class else owner
        if name not in mapping or mapping[name] is not value:
            changed.append((owner, name))
            if is_class:
                _setattr(owner, name, value)
            else:
                mapping[name] = value
    for owner, is_class, names in snapshot.keys:
        mapping = owner.__dict__ if is_class else owner
        if _len(mapping) != _len(names):
            # `warnings` keeps its registry in the globals of the module a warning came from
            for name in [n for n in _list(mapping) if n not in names and n != _registry]:
                changed.append((owner, name))
                if is_class:
                    _delattr(owner, name)
                else:
                    del mapping[name]
    return changed


def _labels(changed):
    return ", ".join(
        "%s.%s" % (owner.get("__name__", "?") if isinstance(owner, dict) else owner.__name__, name)
        for owner, name in changed[:5]
    )


def _stack_problem(trusted, entry, main, pid, skip, name=None, args=(),
                   _get_ident=_get_ident, _getpid=_getpid, _getframe=_getframe, _len=len,
                   _tuple=tuple, _id=id):  # fmt: skip
    """Why the hook function that sent the current event was not called by the runner, or None
    (see the module doc): pytest's check, the whole stack. `name` and `args` (the event) are
    for other checks (`unittest_hooks.py` has its own). Bound like `_restore`."""
    if _get_ident() != main:
        return "a grader hook was called outside the runner's main thread"
    if _getpid() != pid:
        return "a grader hook was called in a forked copy of the runner (pid %d)" % _getpid()
    frame = _getframe(skip)  # skipped: this function and the engine's own; the hook down
    codes = []
    while frame is not None:
        codes.append(frame.f_code)
        frame = frame.f_back
    depth = _len(codes) - _len(entry)
    if depth < 1 or _tuple(_id(code) for code in codes[depth:]) != entry:
        return "a grader hook was called from outside the runner's own call chain"
    for code in codes[:depth]:
        if _id(code) not in trusted:
            return "a grader hook was called by %s (%s:%d), not by the test runner" % (
                code.co_name, code.co_filename, code.co_firstlineno)
    return None


def _signals():
    """Every asynchronous signal: blocked while an event is handled, so no Python signal handler
    (which is handed the current frame) runs inside the grader. Faults stay deliverable."""
    import signal

    faults = set(getattr(signal, n) for n in ("SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGABRT")
                 if hasattr(signal, n))  # fmt: skip
    mask = getattr(signal, "pthread_sigmask", None)
    valid = getattr(signal, "valid_signals", None)
    if mask is None or valid is None:
        return None
    block = set(valid()) - faults
    return lambda: mask(signal.SIG_BLOCK, block), lambda old: mask(signal.SIG_SETMASK, old)


def _handle(event, state, handlers, on_problem, exempt, main, pid, check, _restore=_restore,
            _labels=_labels):  # fmt: skip
    """One event (see `engine`); its handler's result, or None when refused."""
    name, args = event[0], event[1]
    trusted, snapshot = state["trusted"], state["snapshot"]
    if "tracing" in handlers:  # what `quiet` turned off for this event, for the watch
        handlers["tracing"](event[2:] if _len(event) > 2 else None)
    if snapshot is not None:
        changed = _restore(snapshot)
        if changed:
            on_problem("integrity", "the grader's own code was changed while it ran (put "
                       "back): " + _labels(changed))  # fmt: skip
    if name == "trust":
        if trusted is None:
            prefixes, modules, classes = args
            runner = [m for m in _list(sys.modules.values()) if _isinstance(m, types.ModuleType)
                      and (_getattr(m, "__name__", None) or "").split(".")[0] in prefixes]
            trusted = state["trusted"] = module_code(runner, prefixes)
            state["entry"] = _entry(_stack(2), trusted)
            state["snapshot"] = _Snapshot(_list(modules), _list(classes))
            handlers["trusted"](trusted, module_code(_list(modules), prefixes[-1:]))
        return None  # the trusted set stays in here: a caller's frame could be read
    if name in exempt:
        by_runner = trusted is None or check(trusted, state["entry"], main, pid, 3, name,
                                             args) is None  # fmt: skip
        args = args + (by_runner,)
    elif trusted is not None:
        problem = check(trusted, state["entry"], main, pid, 3, name, args)
        if problem is not None:
            on_problem("caller", "%s (event %s)" % (problem, name))
            return None
    result = handlers[name](*args)
    if snapshot is not None:  # what ran during the handler (a repr, a property) may patch
        changed = _restore(snapshot)
        if changed:
            on_problem("integrity", "the grader's own code was changed while it ran (put "
                       "back): " + _labels(changed))  # fmt: skip
    return result


def engine(handlers, on_problem, exempt=(), in_event=None, check=_stack_problem, _handle=_handle,
           _signals=_signals):  # fmt: skip
    """The event loop: `send((name, args))` runs `handlers[name](*args)` and returns its result.
    `on_problem(check, detail)` records a refusal (and is handed nothing the caller gave).

    The event `("trust", (prefixes, modules, classes))`, sent once before any conftest or test
    module is imported, fixes which code is the runner's (every code object of the modules whose
    top-level package is in `prefixes`: pytest, pluggy, plugins installed outside the work tree,
    and last this package), hands it and the grader's own code to `handlers["trusted"]`, and
    snapshots the grader's `modules` and `classes`; until then only the runner's start-up has
    run, and events are not checked. `check(trusted, entry, main, pid, skip, name, args)` says
    why an event's caller is refused, or None (default: the whole stack is the runner's).
    Events in `exempt` are handled whoever calls them, with one more argument: whether the
    runner did (`plugin_registered`: a conftest may register plugins; it only records).
    `in_event` (the guard's) is non-empty while an event is handled; signals are blocked then."""
    main, pid = _get_ident(), _getpid()
    state = {"trusted": None, "snapshot": None, "entry": ()}
    in_event = [] if in_event is None else in_event
    block, unblock = _signals() or (lambda: None, lambda old: None)
    result = None
    while True:
        event = yield result
        old = block()
        in_event.append(1)
        try:
            result = _handle(event, state, handlers, on_problem, exempt, main, pid, check)
        finally:
            in_event.pop()
            unblock(old)


def quiet(send, _gettrace=sys.gettrace, _getprofile=sys.getprofile, _settrace=sys.settrace,
          _setprofile=sys.setprofile):  # fmt: skip
    """`send`, with this thread's trace and profile functions off while the engine handles the
    event: either would be handed the engine's frame (the run's state) as it resumes. So the
    code under test (coverage, a debugger's tests) may install them; they see the hook
    functions' frames, which hold nothing but this `send`, whose caller is checked. The
    returned function has no closure: what it uses is a default argument."""

    def send_quietly(event, _send=send, _gettrace=_gettrace, _getprofile=_getprofile,
                     _settrace=_settrace, _setprofile=_setprofile):  # fmt: skip
        trace, profile = _gettrace(), _getprofile()
        if trace is None and profile is None:
            return _send(event)
        _settrace(None)
        _setprofile(None)
        try:
            return _send((event[0], event[1], trace, profile))
        finally:
            _setprofile(profile)
            _settrace(trace)

    return send_quietly
