"""This process: its CPU time, its torch threads, its log lines, its imports, its claim on the
workdir."""

from __future__ import annotations

import fcntl
import os
import sys
import time
from pathlib import Path
from typing import IO


def preload() -> None:
    """Import now every module a later stage needs: a run lasts hours, and a checkout that
    changes under it (a rebase, a pull) must not hand a late stage newer code than the early ones
    ran with."""
    import harness_gym.engines.smollm2
    import harness_gym.engines.teacher
    import harness_gym.engines.tiny
    import harness_gym.engines.vllm
    import harness_gym.engines.vllm_server
    import harness_gym.integrations.trl
    import harness_gym.integrations.weight_transfer
    import harness_gym.training.evaluation
    import harness_gym.training.report
    import harness_gym.training.sft
    import harness_gym.training.trainers  # noqa: F401


def cpu_seconds() -> float:
    """CPU time of this process (all its threads) and of its finished children (the CLIs, the
    graders): on a shared machine it tracks the work done far better than wall time."""
    import resource

    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class WorkdirBusy(SystemExit):
    """Another run holds the workdir."""


def claim_workdir(workdir: Path) -> IO[str]:
    """Hold the workdir for this process's life (an exclusive `flock` on `run.pid`, which
    names the holder): two runs writing one workdir's checkpoints and traces would corrupt
    both. The lock lives as long as the returned file stays open, and goes with the process
    however it ends. Raises `WorkdirBusy` naming the holder's pid."""
    workdir.mkdir(parents=True, exist_ok=True)
    handle = (workdir / "run.pid").open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        raise WorkdirBusy(
            f"{workdir} is in use by the run of pid {holder} (its run.pid): stop it "
            f"(kill -TERM {holder}) or give another --workdir; --report-only reads a live "
            "run's workdir without claiming it") from None
    handle.truncate(0)
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle
