"""An audit hook (Python 3.8+), installed by the grader's plugin at import, before any conftest,
test module or code under test: the generic ways in-process code could reach the grader's key
or state by introspection are refused, and each refusal is a `tamper` record written at once,
before the refused call returns, so catching the exception does not hide it.

Refused: walks of the object graph (`gc.get_objects`, `gc.get_referrers`, `gc.get_referents`),
every thread's frames (`sys._current_frames`), the frame of a suspended grader generator (its
hook wrappers: `gi_frame`/`cr_frame`/`ag_frame` of grader code), and ctypes' reads and calls
(`string_at`, `from_address`, foreign calls, `pythonapi` symbols: raw memory). `import ctypes`
and loading a library stay allowed. An audit hook cannot be removed once added.

Not covered (docs/reward-integrity.md): plain attribute walks that reach the plugin through
pytest's own objects (its plugin registry), which no audit event marks.
"""

import os
import sys

_GRAPH = frozenset(("gc.get_objects", "gc.get_referrers", "gc.get_referents",
                    "sys._current_frames"))  # fmt: skip
_FRAME_ATTRS = frozenset(("gi_frame", "cr_frame", "ag_frame"))
_CTYPES_OK = frozenset(("ctypes.dlopen",))
_HERE = os.path.dirname(os.path.realpath(__file__)) + os.sep


def install(on_refused):
    """Add the hook; `on_refused(detail)` records a refusal. False where audit hooks do not
    exist (Python < 3.8)."""
    add = getattr(sys, "addaudithook", None)
    if add is None:
        return False
    busy = []  # the hook's own attribute reads raise events too: not re-entered

    def refuse(detail):
        busy.append(1)
        try:
            on_refused(detail)
        finally:
            busy.pop()
        raise RuntimeError("refused by the grader: %s" % detail)

    def hook(event, args):
        if busy:
            return
        if event in _GRAPH:
            refuse("%s() called while the grader runs (an object-graph or frame walk)" % event)
        elif event.startswith("ctypes.") and event not in _CTYPES_OK:
            refuse("%s: ctypes memory access while the grader runs" % event)
        elif event == "object.__getattr__" and len(args) == 2 and args[1] in _FRAME_ATTRS:
            busy.append(1)
            try:
                code = getattr(args[0], args[1][:2] + "_code", None)
                filename = getattr(code, "co_filename", "") or ""
            finally:
                busy.pop()
            if os.path.realpath(filename).startswith(_HERE):
                refuse("%s of the grader's own %s read (a frame walk into the grader)"
                       % (args[1], getattr(code, "co_name", "?")))  # fmt: skip

    add(hook)
    return True
