"""This process: its CPU time, its torch threads, its log lines, its imports."""

from __future__ import annotations

import sys
import time


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
