"""Caps and defences per sandbox backend x trainer user, measured: the table in
docs/reward-integrity.md is rendered from what this writes.

For `bwrap`, `local` (as root, as a throwaway non-root user made with `useradd`, and as root
with the cgroup taken away, as in a container without a writable cgroupfs) and `docker` (root;
the daemon applies its caps whoever asks): caps of 64 processes, 512 MiB and 64 MiB, then in one
sandbox a command that forks 300 times, one that allocates 1 GiB, one that writes 128 MiB, and a
process that leaves its session with a scrubbed environment (`env -i setsid -f`) before
`kill_processes()`; in fresh sandboxes, a fork bomb held at the cap (not run where no cap
holds) and a burst that holds the cap for 2 s; and whether the env refuses to start there (`require_caps`) and starts with
`allow_uncapped=True`. Bounded: a few hundred processes, 1 GiB.

    python benchmarks/caps_matrix.py            # measure, write the results file and the doc
    python benchmarks/caps_matrix.py --render   # the doc's table from the committed file only
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from support.caps_probe import run_probe  # noqa: E402  (the probe tests/test_sandbox_caps.py runs)

RESULTS = REPO / "benchmarks" / "results" / "caps_matrix.json"
DOC = REPO / "docs" / "reward-integrity.md"
START, END = "<!-- caps-matrix: rendered by benchmarks/caps_matrix.py -->", "<!-- /caps-matrix -->"


def _run(names: str, *, as_user: bool, extra: tuple[str, ...] = ()) -> dict:
    try:
        return run_probe(names, as_user=as_user, extra=extra)
    except RuntimeError as error:
        raise SystemExit(str(error)) from None


def measure() -> dict:
    return {
        "limits": {"pids": 64, "memory_mib": 512, "disk_mib": 64},
        "asked": {"forks": 300, "memory_mib": 1024, "file_mib": 128},
        "root": _run("bwrap,local,docker", as_user=False),
        "non-root": _run("bwrap,local", as_user=True),
        "root, no writable cgroupfs": _run("bwrap,local", as_user=False, extra=("nocgroup",)),
    }


def _memory(row: dict) -> str:
    said = " ".join(row["memory"])
    if "MemoryError" in said:
        return "`MemoryError`"
    if "1073741824" in said:
        return "**not capped**: 1 GiB allocated"
    code = said.rpartition("rc=")[2]
    return f"killed (exit {code})" + (", `fault` set" if row.get("memory_fault") else "")


def _disk(row: dict) -> str:
    code, size = row["disk"][0].partition("=")[2], int(row["disk"][-1])
    return f"stopped at {size // 2**20} MiB (exit {code})"


def _escapee(row: dict) -> str:
    esc = row["escapee"]
    if esc["started"] < 1:
        return "(did not start)"
    return "killed" if esc["left_after_kill"] == 0 else "**survives**"


def _bomb(row: dict) -> str:
    bomb = row.get("bomb") or {"skipped": "not measured"}
    if "skipped" in bomb:
        return f"not run ({bomb['skipped']})"
    if bomb["ended_s"] is None or not bomb["fault"]:
        return "**not stopped** in 60 s"
    burst = "; a 2 s burst at the cap: " + ("not stopped" if bomb["burst_fault"] is None
                                             else "**stopped**")
    return f"turn ended at {bomb['ended_s']:g} s, `fault` set{burst}"


def _how(caps: str | None) -> str:
    return "**none**" if not caps else caps.split(" (")[0].replace("=", " ")


def render(results: dict) -> str:
    lines = [
        "| backend, user | processes (300 forks) | memory (1 GiB in one process) "
        "| disk (128 MiB file) | `env -i` + setsid escapee after `kill_processes()` "
        "| fork bomb held at the cap | without `allow_uncapped` |",
        "|---|---|---|---|---|---|---|",
    ]
    for user, names in (("root", ("bwrap", "local", "docker")), ("non-root", ("bwrap", "local")),
                        ("root, no writable cgroupfs", ("bwrap", "local"))):  # fmt: skip
        for name in names:
            row = results[user].get(name) or results[user]
            label = f"{name}, {user}"
            if "unavailable" in row:
                lines.append(f"| {label} | not measured: {row['unavailable']} | | | | | |")
                continue
            caps = row["caps"]
            refusal = f"refuses (`{row['refused']}`)" if row["refused"] else "starts"
            if row["refused"]:
                refusal += "; with it: " + row["allow_uncapped"]
            processes = f"{_how(caps['pids'])}: {row['forked']} started"
            memory = f"{_how(caps['memory'])}: {_memory(row)}"
            lines.append(
                f"| {label} | {processes} | {memory} | {_disk(row)} | {_escapee(row)} "
                f"| {_bomb(row)} | {refusal} |"
            )
    return "\n".join(lines)


def write_doc(results: dict) -> None:
    text = DOC.read_text()
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    DOC.write_text(f"{head}{START}\n{render(results)}\n{END}{tail}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--render", action="store_true", help="render the doc from the file only")
    args = parser.parse_args()
    if not args.render:
        RESULTS.write_text(json.dumps(measure(), indent=1) + "\n")
    write_doc(json.loads(RESULTS.read_text()))


if __name__ == "__main__":
    main()
