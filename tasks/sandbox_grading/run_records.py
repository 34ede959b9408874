"""What both runner integrations (`pytest_plugin`, `unittest_hooks`) record the same way.

`RunRecords` is the base of each one's `_Run` (held only by the engine's frame): `tamper`
records (each one makes the verdict `tampered`; one a check and detail, at most
`MAX_TAMPER_RECORDS` a session, so a test that trips a check in a loop cannot flood the
channel), `error` records of a handler that raised, `tracer` records, and the runner watch's
check. `guarded` and `grader_namespace` are the two integrations' shared start-up pieces.

Being part of this package, the module is trusted runner code, and the engine snapshots its
globals and classes like the rest (`engine.py`).
"""

import sys

from .files import describe

MAX_TAMPER_RECORDS = 20


class RunRecords(object):
    """The records of one runner session. Slots: code under test cannot shadow a method on the
    instance (`_run.tampered = ...`); each subclass adds slots of its own."""

    __slots__ = ("channel", "workdir", "watch", "fired", "tracer_sites")

    def __init__(self, channel, watch=None):
        self.channel = channel
        self.workdir = channel.workdir
        self.watch = watch  # the RunnerWatch, or None until it is taken
        self.fired = set()  # (check, detail) pairs recorded
        self.tracer_sites = set()

    def tampered(self, check, detail):
        key = (check, detail)
        if key in self.fired or len(self.fired) >= MAX_TAMPER_RECORDS:
            return
        self.fired.add(key)
        self.channel.record("tamper", check=check, detail=detail)

    def error(self, where, exc):
        self.channel.record("error", where=where, detail="%s: %s" % (type(exc).__name__, exc))

    def tracer(self, path, line):
        """A trace or profile function from the work tree (its file), or installed from there
        (the file and line that installed it): the grader refuses the code under test's."""
        if (path, line) not in self.tracer_sites:
            self.tracer_sites.add((path, line))
            self.channel.record("tracer", file=describe(path, self.workdir), line=line)

    def check(self, where):
        """The runner watch's check (none before the watch is taken): each change a `runner`
        tamper record, each tracer it saw a `tracer` record."""
        watch = self.watch
        for detail in watch.check() if watch is not None else ():
            self.tampered("runner", "%s (seen at %s)" % (detail, where))
        while watch is not None and watch.tracers:
            self.tracer(watch.tracers.pop(0), None)


def guarded(run, name, method):
    """`method` as an engine handler: a bug in it must not crash the runner, and is recorded."""

    def handle(*args):
        try:
            return method(*args)
        except Exception as exc:  # noqa: BLE001
            run.error(name, exc)
            return None

    return handle


def grader_namespace():
    """(package, its modules, the classes they define): the grader's own code, which the
    engine's `trust` event snapshots, and whose top-level name goes last in its prefixes."""
    package = __name__.rpartition(".")[0]
    modules = [m for n, m in list(sys.modules.items()) if m is not None and
               (n == package or n.startswith(package + "."))]  # fmt: skip
    classes = [v for m in modules for v in list(vars(m).values())
               if isinstance(v, type) and getattr(v, "__module__", "").startswith(package)]
    return package, modules, classes
