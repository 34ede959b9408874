"""The train/held-out split, by code unit, so a held-out task's code never appears in training.

A unit is a source file, or `file::function` when every mutant lives in one file (`inject`); a
history's units are the functions each commit changes, `file::<module>` for code outside any
def (`functions`: a release rewrites the same file, so every commit of parse shared one file).
The held-out units are a seeded, order-free draw (a hash rank), so a resumed or larger run
keeps each unit where it was. A task is held out when all of its units are, trained on when
none is, and `mixed` otherwise (listed apart: neither split may use it without leaking code
across).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["SPLIT_FILE", "heldout_units", "split_of", "write_split"]

SPLIT_FILE = "split.json"


def heldout_units(units: Iterable[str], *, seed: int, fraction: float = 0.2) -> set[str]:
    pool = sorted(set(units))
    if len(pool) < 2:
        return set()
    count = max(1, math.floor(len(pool) * fraction))
    ranked = sorted(pool, key=lambda u: hashlib.sha256(f"{seed}:{u}".encode()).hexdigest())
    return set(ranked[:count])


def split_of(task_units: Iterable[str], heldout: set[str]) -> str:
    units = set(task_units)
    if units <= heldout:
        return "heldout"
    return "train" if not units & heldout else "mixed"


def write_split(out: Path, *, unit: str, heldout: set[str], seed: int) -> dict[str, Any]:
    """Rewrite `out/split.json` from the task folders there (so a resumed run's count is whole)."""
    split: dict[str, Any] = {"unit": unit, "seed": seed, "heldout_units": sorted(heldout),
                             "train": [], "heldout": [], "mixed": []}  # fmt: skip
    for task_file in sorted(out.glob("*/task.json")):
        row = json.loads(task_file.read_text())
        split[row["mine"]["split"]].append(row["instance_id"])
    (out / SPLIT_FILE).write_text(json.dumps(split, indent=2) + "\n")
    return split
