"""Container bookkeeping for the docker backend: who owns a container (so a crashed env's
containers can be reaped by the next one, and never another host's), and tar archives for
`put_archive`."""

from __future__ import annotations

import io
import os
import socket
import tarfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

LABEL = "harness-gym.sandbox"


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot: with the boot id, a pid that was
    reused by another process reads as a different owner."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[19]


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def owner_labels(pid: int | None = None) -> dict[str, str]:
    """The labels that tie a container to the process that created it."""
    pid = os.getpid() if pid is None else pid
    return {
        LABEL: "1",
        f"{LABEL}.owner-pid": str(pid),
        f"{LABEL}.owner-start": _start_time(pid) or "",
        f"{LABEL}.owner-boot-id": _boot_id(),
        f"{LABEL}.owner-host": socket.gethostname(),
    }


def owner_is_gone(labels: Mapping[str, str]) -> bool:
    """Whether the owner of a labelled container has exited. Containers made from another
    host (a shared daemon) are never judged gone: their owner's pids are not ours to read."""
    if labels.get(f"{LABEL}.owner-host") != socket.gethostname():
        return False
    if labels.get(f"{LABEL}.owner-boot-id") != _boot_id():
        return True  # this host rebooted since
    try:
        pid = int(labels.get(f"{LABEL}.owner-pid", ""))
    except ValueError:
        return True
    start = _start_time(pid)
    return start is None or start != labels.get(f"{LABEL}.owner-start")


# -- files in and out ------------------------------------------------------------------------


def _tar(entries: Sequence[tuple[str, bytes | None, int]]) -> bytes:
    """A tar of (name, data, mode) entries; data None makes a directory."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data, mode in entries:
            info = tarfile.TarInfo(name)
            info.mode = mode
            info.mtime = int(time.time())
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _tar_tree(root: Path, arcname: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(root, arcname=arcname)  # symlinks stay links
    return buf.getvalue()


# -- jobs ------------------------------------------------------------------------------------
