"""The caps probe, one script for `benchmarks/caps_matrix.py` (the table in
docs/reward-integrity.md) and `tests/test_sandbox_caps.py` (its assertions), so both measure the
same thing: caps of 64 processes, 512 MiB and 64 MiB, then in one sandbox a command that forks 300
times, one that allocates 1 GiB, one that writes 128 MiB, and a process that leaves its session
with a scrubbed environment (`env -i setsid -f`) before `kill_processes()`; in fresh sandboxes, a fork bomb held at the cap (bounded by it; not run
where no cap holds) and a burst that holds the cap for 2 s; and whether the env
refuses to start (`require_caps`) and starts with `allow_uncapped=True`.

`run_probe(names, as_user=..., extra=...)` runs `caps_probe_script.py` in a fresh interpreter,
as this user or as a throwaway non-root one (`as_user.py`), and returns what it printed as a
dict. `extra` "nocgroup": this host as a container without a writable cgroupfs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PROBE = Path(__file__).with_name("caps_probe_script.py")


def run_probe(
    names: str, *, as_user: bool, extra: tuple[str, ...] = (), timeout: int = 600
) -> dict:
    """`names`: backends, comma-separated (bwrap, local, docker). {"unavailable": why} when no
    throwaway user can be made; raises RuntimeError when the probe itself fails."""
    script = PROBE.read_text()
    if as_user:
        from .as_user import run_as_user, why_not

        if why := why_not():
            return {"unavailable": why}
        script = script.replace("sys.argv[1]", repr(names)).replace(
            "sys.argv[2:]", repr(list(extra)))  # fmt: skip
        done = run_as_user(script, timeout=timeout)
    else:
        done = subprocess.run([sys.executable, "-c", script, names, *extra],
                              capture_output=True, text=True, timeout=timeout)  # fmt: skip
    said = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if not said:
        raise RuntimeError(f"measuring {names} failed: {done.stderr[-3000:]}")
    return json.loads(said[-1][len("RESULT "):])
