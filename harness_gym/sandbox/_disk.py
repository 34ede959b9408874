"""A disk cap for a sandbox whose files live in a host directory (`local`, `bwrap`).

No mechanism here both caps a directory's size and works without privileges (a tmpfs or a loop
mount needs root, quotas need filesystem support), so the cap is a check: while the agent's
commands run, a thread measures the tree and, once it is over the limit, calls `on_exceeded` (the
sandbox kills its processes and records why). It measures as often as costs it about a tenth of a
core (every `MIN_INTERVAL_S` for a task repo, less often for a big tree, at least every
`interval_s`), so a writer overshoots by what it writes between two measurements plus the kill;
commands also run with RLIMIT_FSIZE at the limit (`prlimit`), so no single file grows past it.
The episode then ends `harness_error`, and the host disk keeps its space.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

from ._watch import TurnWatch

MIN_INTERVAL_S = 0.05
SCANS_PER_WAIT = 10  # wait ten scans' time between scans: about a tenth of a core at most


def tree_bytes(root: Path | str) -> int:
    """Bytes allocated to the files under `root` (sparse files count what they hold; hard links
    once; symlinks are not followed)."""
    total = 0
    seen: set[tuple[int, int]] = set()
    stack = [str(root)]
    while stack:
        try:
            entries = os.scandir(stack.pop())
        except OSError:  # removed meanwhile, or not readable
            continue
        with entries:
            for entry in entries:
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISDIR(info.st_mode):
                    stack.append(entry.path)
                elif info.st_nlink > 1:
                    key = (info.st_dev, info.st_ino)
                    if key in seen:
                        continue
                    seen.add(key)
                total += info.st_blocks * 512
    return total


class DiskWatch(TurnWatch):
    """Measures `root` every `interval_s` from `start()` to `stop()`; over `limit_bytes`, calls
    `on_exceeded(bytes_used)` once and stops."""

    thread_name = "harness-gym-disk-watch"

    def __init__(
        self,
        root: Path,
        limit_bytes: int,
        on_exceeded: Callable[[int], None],
        interval_s: float = 1.0,
    ) -> None:
        super().__init__()
        self.root = root
        self.limit_bytes = limit_bytes
        self.interval_s = interval_s
        self._on_exceeded = on_exceeded

    def _run(self) -> None:
        wait_s = MIN_INTERVAL_S
        while not self._stop.wait(wait_s):
            started = time.monotonic()
            used = tree_bytes(self.root)
            if used > self.limit_bytes:
                self._stop.set()
                self._on_exceeded(used)
                return
            scan_s = time.monotonic() - started
            wait_s = min(self.interval_s, max(MIN_INTERVAL_S, SCANS_PER_WAIT * scan_s))
