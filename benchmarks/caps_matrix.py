"""Caps and defences per sandbox backend x trainer user, measured: the table in
docs/reward-integrity.md is rendered from what this writes.

For `bwrap`, `local` (as root, as a throwaway non-root user made with `useradd`, and as root
with the cgroup taken away, as in a container without a writable cgroupfs) and `docker` (root;
the daemon applies its caps whoever asks): caps of 64 processes, 512 MiB and 64 MiB, then in one
sandbox a command that forks 300 times, one that allocates 1 GiB, one that writes 128 MiB, and a
process that leaves its session with a scrubbed environment (`env -i setsid -f`) before
`kill_processes()`; and whether the env refuses to start there (`require_caps`) and starts with
`allow_uncapped=True`. Bounded: a few hundred processes, 1 GiB.

    python benchmarks/caps_matrix.py            # measure, write the results file and the doc
    python benchmarks/caps_matrix.py --render   # the doc's table from the committed file only
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results" / "caps_matrix.json"
DOC = REPO / "docs" / "reward-integrity.md"
START, END = "<!-- caps-matrix: rendered by benchmarks/caps_matrix.py -->", "<!-- /caps-matrix -->"

MEASURE = textwrap.dedent(r"""
    import json, os, sys, time, uuid, warnings
    warnings.simplefilter("ignore")
    from harness_gym.sandbox import local as local_module
    from harness_gym.sandbox.base import SandboxLimits, SandboxSpec
    from harness_gym.sandbox.bwrap import BwrapSandboxBackend, bwrap_available
    from harness_gym.sandbox.caps import UncappedSandboxError, require_caps
    from harness_gym.sandbox.local import LocalSandboxBackend

    FORK = (
        "import os, time\nn = 0\nfor _ in range(300):\n    try:\n        pid = os.fork()\n"
        "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(1)\n"
        "        os._exit(0)\n    n += 1\nprint(n)\n"
    )
    MEMORY = "python3 -c 'b = bytearray(2**30); print(len(b))' 2>&1 | tail -1; echo rc=${PIPESTATUS[0]}"
    # The output is printed once the file is gone: docker keeps a command's output under the
    # capped /sandbox, which the file has just filled.
    DISK = "head -c 134217728 /dev/zero > big 2>/dev/null; r=$?; s=$(stat -c %s big); rm -f big; echo rc=$r; echo $s"
    limits = SandboxLimits(pids=64, memory_bytes=512 * 2**20, disk_bytes=64 * 2**20)

    def alive(mark):
        found = 0
        for entry in os.listdir("/proc"):
            try:
                if entry.isdigit() and mark in open("/proc/%s/cmdline" % entry, "rb").read():
                    found += 1
            except OSError:
                pass
        return found

    def measure(backend):
        backend.set_limits(limits)
        caps = backend.caps()
        try:
            require_caps(backend, limits)
            refused = None
        except UncappedSandboxError as error:
            refused = str(error).split(":")[0]
        try:
            require_caps(backend, limits, allow_uncapped=True)
            opted_out = "starts"
        except UncappedSandboxError as error:
            opted_out = "refused: %s" % error
        secs = "1000.%d" % (uuid.uuid4().int % 10**8)
        with backend.create(SandboxSpec()) as box:
            row = {
                "caps": {"pids": caps.pids, "memory": caps.memory, "disk": caps.disk},
                "missing": caps.missing(),
                "refused": refused,
                "allow_uncapped": opted_out,
                "forked": int(box.exec(["python3", "-c", FORK]).stdout.strip() or -1),
                "memory": box.exec(MEMORY).stdout.strip().splitlines(),
            }
            box.kill_processes()  # where the kernel killed at the cgroup's cap, it says so
            row["memory_fault"] = box.fault
            row["disk"] = box.exec(DISK).stdout.strip().splitlines()
            box.start("env -i setsid -f sleep %s; sleep 1000" % secs)
            deadline = time.monotonic() + 10
            while alive(secs.encode()) < 1 and time.monotonic() < deadline:
                time.sleep(0.02)
            started = alive(secs.encode())
            box.kill_processes()
            row["escapee"] = {"started": started, "left_after_kill": alive(secs.encode())}
        return row

    out = {"uid": os.geteuid()}
    names = sys.argv[1].split(",")
    if "nocgroup" in sys.argv[2:]:  # this host as a container without a writable cgroupfs
        local_module.cgroup_parent = lambda: None
        local_module.memory_parent = lambda: None
        local_module.SandboxCgroup.make = staticmethod(lambda *args: None)
    for name in names:
        if name == "bwrap" and not bwrap_available():
            out[name] = {"unavailable": "bubblewrap cannot run here"}
            continue
        if name == "docker":
            from harness_gym.sandbox.docker import DockerSandboxBackend, docker_unavailable
            why = docker_unavailable()
            if why:
                out[name] = {"unavailable": why}
                continue
            backend = DockerSandboxBackend()
        else:
            backend = {"local": LocalSandboxBackend, "bwrap": BwrapSandboxBackend}[name]()
        try:
            out[name] = measure(backend)
        finally:
            backend.close()
    print("RESULT " + json.dumps(out))
""")


def _run(names: str, *, as_user: bool, extra: tuple[str, ...] = ()) -> dict:
    if as_user:
        sys.path.insert(0, str(REPO / "tests"))
        from support.as_user import run_as_user, why_not

        if why := why_not():
            return {"unavailable": why}
        script = MEASURE.replace("sys.argv[1]", repr(names)).replace(
            "sys.argv[2:]", repr(list(extra)))  # fmt: skip
        done = run_as_user(script, timeout=600)
    else:
        done = subprocess.run([sys.executable, "-c", MEASURE, names, *extra],
                              capture_output=True, text=True, timeout=600)  # fmt: skip
    said = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if not said:
        raise SystemExit(f"measuring {names} failed: {done.stderr[-3000:]}")
    return json.loads(said[-1][len("RESULT "):])


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


def _how(caps: str | None) -> str:
    return "**none**" if not caps else caps.split(" (")[0].replace("=", " ")


def render(results: dict) -> str:
    lines = [
        "| backend, user | processes (300 forks) | memory (1 GiB in one process) "
        "| disk (128 MiB file) | `env -i` + setsid escapee after `kill_processes()` "
        "| without `allow_uncapped` |",
        "|---|---|---|---|---|---|",
    ]
    for user, names in (("root", ("bwrap", "local", "docker")), ("non-root", ("bwrap", "local")),
                        ("root, no writable cgroupfs", ("bwrap", "local"))):  # fmt: skip
        for name in names:
            row = results[user].get(name) or results[user]
            label = f"{name}, {user}"
            if "unavailable" in row:
                lines.append(f"| {label} | not measured: {row['unavailable']} | | | | |")
                continue
            caps = row["caps"]
            refusal = f"refuses (`{row['refused']}`)" if row["refused"] else "starts"
            if row["refused"]:
                refusal += "; with it: " + row["allow_uncapped"]
            processes = f"{_how(caps['pids'])}: {row['forked']} started"
            memory = f"{_how(caps['memory'])}: {_memory(row)}"
            lines.append(
                f"| {label} | {processes} | {memory} | {_disk(row)} | {_escapee(row)} | {refusal} |"
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
