"""A full process table ends the agent's turn (`local`, `bwrap`, `docker`).

The pids cap (the sandbox's cgroup, else RLIMIT_NPROC) stops a fork bomb from taking the host,
but not from taking the episode: with every slot held by the bomb, the CLI cannot start its next
tool call, and it waits (measured: Pi sat out a 300 s episode timeout on two loaded cores). So
while the agent's commands run, a thread looks at the sandbox's process count; once it has stayed
at the cap (at least `FULL_FRACTION` of it) for `HELD_S`, with some fork refused meanwhile where
the cgroup counts refusals, it calls `on_full(limit)`: the sandbox kills its processes and
records why, and the episode ends `harness_error` at once. A build that touches the cap for a
moment and backs off is not stopped.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from . import _processes as procs
from ._watch import TurnWatch

HELD_S = 5.0
INTERVAL_S = 0.5
FULL_FRACTION = 0.9


class Census:
    """How many tasks (processes and threads: what the caps count) a sandbox holds, and how many
    of its forks were refused so far (None where nothing counts them); `interval_s`: how often
    it is worth a look (what a look costs)."""

    interval_s = INTERVAL_S

    def tasks(self) -> int:
        raise NotImplementedError

    def refused(self) -> int | None:
        return None


class CgroupCensus(Census):
    """The cgroup's own counters (`pids.current`; `pids.events`' `max`: forks refused)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def tasks(self) -> int:
        try:
            return int((self.path / "pids.current").read_text())
        except (OSError, ValueError):
            return 0

    def refused(self) -> int | None:
        try:
            for line in (self.path / "pids.events").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "max":
                    return int(value)
        except (OSError, ValueError):
            pass
        return None


class MarkedCensus(Census):
    """The threads of the processes that carry the sandbox's marker (RLIMIT_NPROC counts each
    thread; a process that scrubbed its environment is missed, as by `kill_marked`). A look
    reads every process's environment: once a second."""

    interval_s = 1.0

    def __init__(self, var: str, value: str) -> None:
        self.var, self.value = var, value

    def tasks(self) -> int:
        total = 0
        for pid in procs.marked_pids(self.var, self.value):
            try:
                total += len(os.listdir(f"/proc/{pid}/task"))
            except OSError:  # gone meanwhile
                continue
        return total


class CountCensus(Census):
    """A count some other part measures (a container's `pids_stats`: an API call, once a
    second)."""

    interval_s = 1.0

    def __init__(self, count: Callable[[], int]) -> None:
        self.count = count

    def tasks(self) -> int:
        return self.count()


class PidsWatch(TurnWatch):
    """Looks at `census` every `interval_s` (the census's own by default) from `start()` to
    `stop()`; once the count has held at the cap for `held_s`, calls `on_full(limit)` once and
    stops."""

    thread_name = "harness-gym-pids-watch"

    def __init__(
        self,
        census: Census,
        limit: int,
        on_full: Callable[[int], None],
        *,
        held_s: float = HELD_S,
        interval_s: float | None = None,
    ) -> None:
        super().__init__()
        self.census = census
        self.limit = limit
        self.held_s = held_s
        self.interval_s = census.interval_s if interval_s is None else interval_s
        self._on_full = on_full

    def _run(self) -> None:
        # A held bomb is mostly idle (each of its shells waits on its children), so refusals
        # come in bursts: the cap counts as full once the count has held there for `held_s`
        # and some fork was refused since it got there.
        full_since: float | None = None
        refused_then = refused = self.census.refused()
        while not self._stop.wait(self.interval_s):
            refused_before, refused = refused, self.census.refused()
            now = time.monotonic()
            if self.census.tasks() < FULL_FRACTION * self.limit:
                full_since = None
                continue
            if full_since is None:
                full_since, refused_then = now, refused_before
            held = now - full_since >= self.held_s
            turned_away = refused is None or (refused_then is not None and refused > refused_then)
            if held and turned_away:
                self._stop.set()
                self._on_full(self.limit)
                return
