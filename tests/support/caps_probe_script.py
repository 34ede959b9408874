"""Run by `caps_probe.run_probe` in a fresh interpreter (see there): prints `RESULT <json>`."""

import json
import os
import sys
import time
import uuid
import warnings

from harness_gym.sandbox import local as local_module
from harness_gym.sandbox.base import SandboxLimits, SandboxSpec
from harness_gym.sandbox.bwrap import BwrapSandboxBackend, bwrap_available
from harness_gym.sandbox.caps import UncappedSandboxError, require_caps
from harness_gym.sandbox.local import LocalSandboxBackend

warnings.simplefilter("ignore")  # `local` warns that it does not isolate, once per backend

FORK = (
    "import os, time\nn = 0\nfor _ in range(300):\n    try:\n        pid = os.fork()\n"
    "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(1)\n"
    "        os._exit(0)\n    n += 1\nprint(n)\n"
)
MEMORY = "python3 -c 'b = bytearray(2**30); print(len(b))' 2>&1 | tail -1; echo rc=${PIPESTATUS[0]}"
# The output is printed once the file is gone: docker keeps a command's output under the
# capped /sandbox, which the file has just filled.
DISK = ("head -c 134217728 /dev/zero > big 2>/dev/null; r=$?; s=$(stat -c %s big); rm -f big; "
        "echo rc=$r; echo $s")
# Bounded by the cap it fills (64 here): a fork bomb whose processes keep every slot taken.
BOMB = "bash -c 'b() { b | b & }; b' >/dev/null 2>&1 </dev/null; sleep 1000"
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

def my_processes():
    """Processes of this (non-root) user but the probe: RLIMIT_NPROC counts them all."""
    found = 0
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and int(entry) != os.getpid() and \
                    os.stat("/proc/" + entry).st_uid == os.getuid():
                found += 1
        except OSError:
            pass
    return found

def settled():
    """As a non-root user, the processes the last backend's sandboxes killed (its fork bomb)
    may not all be gone yet: they count against this backend's RLIMIT_NPROC too, and would
    make its forks fail. Wait (up to 30 s) and say how many were left."""
    if os.getuid() == 0:  # a cgroup per sandbox: nothing carries over
        return 0
    deadline = time.monotonic() + 30
    while my_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    return my_processes()

def measure(backend):
    leftovers = settled()
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
            "leftovers_at_start": leftovers,
            "missing": caps.missing(),
            "pids_limited": getattr(box, "pids_limited", None),  # local and bwrap say
            "memory_limited": getattr(box, "memory_limited", None),
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
    row["bomb"] = bomb(backend, caps)
    return row

def bomb(backend, caps):
    """How a fork bomb's turn ends: whether the sandbox stopped it (its job ended within 60 s)
    and what fault it recorded; and the fault after a burst that holds the cap for 2 s only."""
    if not caps.pids:  # nothing would bound it: never run here
        return {"skipped": "no process cap"}
    with backend.create(SandboxSpec()) as box:
        burst = box.start(["python3", "-c", FORK.replace("time.sleep(1)", "time.sleep(2)")])
        burst.wait(timeout=60)
        burst_fault = box.fault
    with backend.create(SandboxSpec()) as box:
        started = time.monotonic()
        job = box.start(BOMB)
        result = job.wait(timeout=60)
        return {"ended_s": None if result.timed_out else round(time.monotonic() - started, 1),
                "fault": box.fault, "burst_fault": burst_fault}

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
