"""Tamper checks on the test runner, from inside its own process.

`RunnerWatch` takes a baseline of what decides a test's outcome, before any code under test is
imported, and `check()` says what changed since:

- every function, class and descriptor in the runner's modules (`_pytest.*`, `pytest`,
  `pluggy.*`, `unittest.*`, this package) and in the classes they define: `_pytest.runner.
  call_and_report = ...`, `TestReport.passed = property(...)` or `pytest.xfail = ...`;
- new class attributes that shadow an inherited one, new module globals that shadow a builtin;
- the builtin exception types (`builtins.AssertionError = Skipped`) and a few builtin functions;
  at the baseline, each builtin exception must be the interpreter's own (C) type;
- the tracing and profiling hooks: one defined in the work tree (`sys.settrace` can make a test
  jump over its assert lines) is reported in `tracers` (its file: the grader refuses one from
  the code under test, not one from a test file); coverage's tracer, installed outside, is not;
- extra objects the caller registers (`watch_attribute`): pluggy's hook executor, hook
  implementations, and so on.

A check costs a pass over tuples with `operator.is_`: cheap enough to run around every phase of
every test.
"""

import builtins
import gc
import operator
import os
import sys
import types

_is = operator.is_
_getitem = operator.getitem
_itemgetter = operator.itemgetter
_HEAPTYPE = 1 << 9
# pytest patches a few of its own classes at configure time (its legacypath plugin adds the
# py.path-flavoured properties), and installed plugins patch pytest too (hypothesis wraps
# FixtureFunctionMarker.__call__): a value whose code lives there is not an attack.
_SELF_PATCHING_FILES = (os.sep + os.path.join("_pytest", "legacypath.py"),)
WATCHED_PREFIXES = ("_pytest", "pytest", "pluggy", "unittest", "_harness_gym_grading")
_BUILTIN_FUNCTIONS = (
    "isinstance", "issubclass", "type", "getattr", "hasattr", "setattr", "super", "object",
    "callable", "id", "len", "iter", "next", "repr", "str", "bool", "__build_class__",
)  # fmt: skip; not __import__, which tests patch (monkeypatch) to simulate missing modules


_GROUPS = getattr(builtins, "BaseExceptionGroup", ())


def _code_file(value):
    """The source file of a function, method or property's getter, else None."""
    value = getattr(value, "fget", value)
    value = getattr(value, "__func__", value)
    code = getattr(value, "__code__", None)
    return getattr(code, "co_filename", None)


def _by_trusted_code(value, trusted_files):
    """Whether `value` is code from pytest's self-patching module or a trusted plugin's file."""
    path = _code_file(value)
    return bool(path) and (path.endswith(_SELF_PATCHING_FILES) or path in trusted_files)


def _watched_value(value):
    """Functions, classes and descriptors decide behaviour; data does not."""
    return callable(value) or hasattr(type(value), "__get__")


_ROUTINES = (types.FunctionType, types.BuiltinFunctionType, type)


def _watched_global(value):
    """A module's functions and classes (not its imported modules, typing aliases or data)."""
    return isinstance(value, _ROUTINES) and not isinstance(value, types.ModuleType)


def _live_dict(cls):
    """The dict behind `cls.__dict__` (a read-only proxy, slower to index): the same live
    mapping, which `setattr(cls, ...)` updates."""
    proxy = cls.__dict__
    for referent in gc.get_referents(proxy):
        if isinstance(referent, dict) and referent.keys() == proxy.keys():
            return referent
    return proxy


def _getter(keys):
    if len(keys) == 1:
        key = keys[0]
        return lambda mapping: (mapping[key],)
    return _itemgetter(*keys)


class _Namespace(object):
    __slots__ = ("label", "mapping", "keys", "values", "get", "size", "known", "kind", "owner")

    def __init__(self, label, mapping, keys, kind, owner=None):
        self.label = label
        self.mapping = mapping
        self.keys = tuple(keys)
        self.values = tuple(mapping[k] for k in self.keys)
        self.get = _getter(self.keys) if self.keys else (lambda mapping: ())
        self.size = len(mapping)
        self.known = set(mapping)
        self.kind = kind  # "module", "class" or "builtins"
        self.owner = owner


class RunnerWatch(object):
    """Identity baseline of the runner; see the module doc."""

    __slots__ = ("_workdir", "_prefixes", "_namespaces", "_seen_modules", "_attributes", "_flat",
                 "trusted_files", "problems", "tracing", "tracers", "_seen_tracers")

    def __init__(self, workdir, prefixes=WATCHED_PREFIXES):
        self._workdir = workdir
        self._prefixes = tuple(prefixes)
        self._namespaces = []
        self._seen_modules = set()
        self._attributes = []  # (label, getter, expected)
        self._flat = None  # every watched entry in three parallel tuples: the fast check
        self.trusted_files = set()  # source files of plugins installed outside the work tree
        self.problems = []  # baseline problems (a runner already tampered with)
        self.tracing = None  # (trace, profile) while `engine.quiet` has them off, else None
        self.tracers = []  # files of work-tree trace/profile functions seen, for the caller
        self._seen_tracers = set()
        self._watch_builtins()
        self.extend()

    # -- baseline ----------------------------------------------------------------------------

    def _watch_builtins(self):
        mapping = builtins.__dict__
        keys = []
        for name, value in list(mapping.items()):
            if isinstance(value, type) and issubclass(value, BaseException):
                keys.append(name)
                # ExceptionGroup is built at run time, as a heap type, by the interpreter itself.
                if value.__flags__ & _HEAPTYPE and not issubclass(value, _GROUPS):
                    self.problems.append(
                        "builtins.%s is not the interpreter's own exception type (it is %r)"
                        % (name, value)
                    )
        keys += [name for name in _BUILTIN_FUNCTIONS if name in mapping]
        try:
            assert False  # noqa: B011 - the C-level AssertionError, whatever builtins holds
        except BaseException as raised:  # noqa: BLE001
            if sys.version_info >= (3, 9) and type(raised) is not mapping.get("AssertionError"):
                self.problems.append("builtins.AssertionError is not the type `assert` raises")
        self._namespaces.append(_Namespace("builtins", mapping, keys, "builtins"))

    def _wanted(self, name):
        return any(name == p or name.startswith(p + ".") for p in self._prefixes)

    def extend(self):
        """Add runner modules imported since the last call (pytest imports some lazily)."""
        self._flat = None
        for name, module in list(sys.modules.items()):
            if module is None or name in self._seen_modules or not self._wanted(name):
                continue
            self._seen_modules.add(name)
            self._watch_module(name, module)

    def _watch_module(self, name, module):
        mapping = getattr(module, "__dict__", None)
        if not isinstance(mapping, dict):
            return
        # Replacing the module itself (`sys.modules[name] = fake`) reaches every later import.
        self.watch_attribute("sys.modules[%r]" % name, lambda: sys.modules.get(name))
        items = list(mapping.items())
        keys = [k for k, v in items if _watched_global(v) or k == "__builtins__"]
        self._namespaces.append(_Namespace(name, mapping, keys, "module"))
        for key, value in items:
            if isinstance(value, type) and getattr(value, "__module__", None) == name:
                self._watch_class("%s.%s" % (name, key), value)

    def _watch_class(self, label, cls):
        mapping = _live_dict(cls)
        keys = [k for k, v in list(mapping.items()) if _watched_value(v)]
        self._namespaces.append(_Namespace(label, mapping, keys, "class", cls))

    def watch_attribute(self, label, getter):
        """Watch `getter()` (e.g. an instance attribute) for identity from now on."""
        try:
            expected = getter()
        except Exception:  # noqa: BLE001 - absent in this runner version
            return
        self._attributes.append((label, getter, expected))

    def _from_work_tree(self, hook):
        """The file of a trace/profile function if it is code from the work tree, else None."""
        path = _code_file(hook) or _code_file(getattr(hook, "__call__", None))
        if path is None:
            module = sys.modules.get(getattr(type(hook), "__module__", "") or "")
            path = getattr(module, "__file__", None)
        if not path or not isinstance(path, str):
            return None
        real = os.path.realpath(path)
        inside = real == self._workdir or real.startswith(self._workdir + os.sep)
        return path if inside else None

    # -- the check -------------------------------------------------------------------------

    def _flatten(self):
        maps, keys, values = [], [], []
        for ns in self._namespaces:
            maps.extend([ns.mapping] * len(ns.keys))
            keys.extend(ns.keys)
            values.extend(ns.values)
        mappings = tuple(ns.mapping for ns in self._namespaces)
        sizes = [ns.size for ns in self._namespaces]
        self._flat = (tuple(maps), tuple(keys), tuple(values), mappings, sizes)

    def _unchanged(self):
        """One pass in C over every watched entry: the common case, nothing changed."""
        if self._flat is None:
            self._flatten()
        maps, keys, values, mappings, sizes = self._flat
        try:
            same = all(map(_is, map(_getitem, maps, keys), values))
        except KeyError:
            return False
        return same and list(map(len, mappings)) == sizes

    def check(self):
        """What changed since the baseline, as messages (empty: nothing)."""
        fired = []
        if not self._unchanged():
            fired.extend(self._changes())
            self._flat = None  # the baseline moved on: each change is reported once
        for label, getter, expected in self._attributes:
            try:
                now = getter()
            except Exception as error:  # noqa: BLE001
                fired.append("%s is gone (%s)" % (label, type(error).__name__))
                continue
            if now is not expected:
                fired.append("%s was replaced (%r)" % (label, _short(now)))
        hooks = self.tracing or (sys.gettrace(), sys.getprofile())
        for hook in hooks:
            path = self._from_work_tree(hook) if hook is not None else None
            if path is not None and path not in self._seen_tracers:
                self._seen_tracers.add(path)
                self.tracers.append(path)
        return fired

    def _changes(self):
        """The slow path: which entries changed, namespace by namespace."""
        fired = []
        for ns in self._namespaces:
            try:
                values = ns.get(ns.mapping)
            except KeyError:
                missing = [k for k in ns.keys if k not in ns.mapping]
                fired.append("%s.%s was deleted" % (ns.label, missing[0]))
                ns.keys = tuple(k for k in ns.keys if k in ns.mapping)
                ns.values = tuple(ns.mapping[k] for k in ns.keys)
                ns.get = _getter(ns.keys) if ns.keys else (lambda mapping: ())
                continue
            if not all(map(_is, values, ns.values)):
                fired.extend(self._replaced(ns, values))
            if len(ns.mapping) != ns.size:
                fired.extend(self._new_keys(ns))
        return fired

    def _replaced(self, ns, values):
        fired = []
        for key, now, then in zip(ns.keys, values, ns.values):
            if now is not then and not _by_trusted_code(now, self.trusted_files):
                fired.append("%s.%s was replaced (%r)" % (ns.label, key, _short(now)))
        ns.values = tuple(values)  # report each replacement once
        return fired

    def _new_keys(self, ns):
        fired = []
        added = [k for k in list(ns.mapping) if k not in ns.known]
        ns.size = len(ns.mapping)
        ns.known.update(added)
        for key in added:
            if ns.kind == "module" and key in builtins.__dict__:
                fired.append("module %s gained a global %r that shadows the builtin" % (ns.label, key))
            elif ns.kind == "class":
                value = ns.mapping.get(key)
                shadows = any(
                    key in base.__dict__ and _watched_value(base.__dict__[key])
                    for base in ns.owner.__mro__[1:]
                )
                trusted = _by_trusted_code(value, self.trusted_files)
                if (shadows or _watched_value(value)) and not trusted:
                    fired.append("class %s gained attribute %r (%r)" % (ns.label, key, _short(value)))
            elif ns.kind == "builtins" and key in _BUILTIN_FUNCTIONS:
                fired.append("builtins.%s was added" % key)
        return fired


def _short(value):
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."
