"""The same GRPO training budget, synchronous vs asynchronous, side by side in one run.

    python benchmarks/async_vs_sync.py [--steps 20] [--batch 4] [--group 2] [--max-staleness 2]
                                       [--cores split] [--async-groups N] [--json FILE]
    python benchmarks/async_vs_sync.py --quick     # 2 steps, batch 2, shared cores: a smoke

Both paths train the tiny model on real Pi episodes of the built-in tasks, `--batch` rollouts
per optimiser step in GRPO groups of `--group`, 32 tokens per model call:

- sync: TRL's `GRPOTrainer` with our `rollout_func` (`integrations/trl.py`); each step runs its
  batch of episodes, waits for the slowest, then optimises while no episode runs.
- lockstep: the async path's own loop, loss and engine on the synchronous schedule
  (`max_groups_per_version`: each step's episodes start after the step before). The control:
  GRPOTrainer's step costs more than our loop's (it pads the batch; ours forwards one sample at
  a time from its first trained token), and that difference is not asynchrony.
- async: `AsyncGRPOLoop` with `HarnessRolloutWorker` (`integrations/async_loop.py`); episodes run
  all the time and the optimiser takes samples as they come. With the same episodes in flight
  as the other two (`batch`, the default), so the comparison is of asynchrony alone, not of a
  head start; `--async-groups N` runs N groups at once instead (TRL's `max_inflight_tasks` rule
  would be `max_staleness * batch / group`), reported with its count.

Where the work runs (`--cores`, each mode runs both paths):

- split (the production shape): the trainer on one core, the rollouts (the engine's decode
  thread, the episode threads and every process they start: CLIs, sandboxes, git, pytest) on
  the other, as a GPU trainer and vLLM servers + sandbox nodes are separate machines. Sync
  leaves each side idle while the other works; async keeps both busy.
- shared: both on both cores. Here the optimiser step and the rollouts each saturate the two
  cores on their own, so overlapping them cannot shorten anything: async only moves the CPU
  from one to the other (measured under load: 0.87x of the lockstep control, 0.39-1.21x of
  sync in three runs).

Reported per path, over the whole run, from the start of training (engine, proxy and CLI
start-up included: a run pays them) to the end of its last optimiser step: `steps`,
`whole_run_steps_per_hour`, `episodes` finished by then and `episodes_per_hour`, and the
optimiser's idle fraction (time waiting for rollouts / that span); also the steady state (end of
step 1 to the end of the last) for reference. At least 20 steps make a measurement (fewer
print a warning). Rewards alternate 1, 0 within a group (the tiny model fails every task alike),
so every step has a gradient; this does not change the timing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, TrainerCallback  # noqa: E402

from harness_gym.engines.tiny import load_tiny_tokenizer, tiny_model_dir  # noqa: E402

MAX_TOKENS = 32


def alternating_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    return [float(i % 2 == 0) for i in range(len(completions))]


class CoreSplit:
    """Pins this process's main thread (the trainer) to `trainer_core` and every other thread
    of it, and every process below it with all their threads, to `rollout_cores`; re-applied
    every 0.1 s as episodes start threads and processes (a child inherits the mask of the
    thread that forks it, so most are right from birth)."""

    def __init__(self, trainer_core: int, rollout_cores: set[int]) -> None:
        self.trainer, self.rollouts = {trainer_core}, rollout_cores
        self.pid = os.getpid()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="core-split", daemon=True)

    def __enter__(self) -> CoreSplit:
        os.sched_setaffinity(0, self.trainer)  # the calling (main) thread
        torch.set_num_threads(1)  # the trainer's OpenMP team: per thread, this one only
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        os.sched_setaffinity(0, self.trainer | self.rollouts)
        torch.set_num_threads(len(self.trainer | self.rollouts))

    def _run(self) -> None:
        os.sched_setaffinity(0, self.rollouts)
        tick = 0
        while not self._stop.wait(0.1):
            for tid in _tasks(self.pid):
                if tid != self.pid:
                    _pin(tid, self.rollouts)
            tick += 1
            if tick % 3 == 0:
                for child in _descendants(self.pid):
                    for tid in _tasks(child):
                        _pin(tid, self.rollouts)


def _tasks(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def _pin(tid: int, cores: set[int]) -> None:
    with contextlib.suppress(OSError):  # the thread may have ended
        if os.sched_getaffinity(tid) != cores:
            os.sched_setaffinity(tid, cores)


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


@contextlib.contextmanager
def placement(mode: str) -> Iterator[None]:
    cores = sorted(os.sched_getaffinity(0))
    if mode == "shared":
        yield
        return
    if len(cores) < 2:
        raise SystemExit("--cores split needs two cores")
    with CoreSplit(cores[0], set(cores[1:])):
        yield


MEASURED_STEPS = 20  # fewer steps: start-up and one slow episode dominate


def whole_run(started: float, step_ends: list[float], idle_s: list[float],
              episode_ends: list[float]) -> dict[str, Any]:
    """A path's figures from `started` to its last step's end (monotonic times); `idle_s[i]`
    is step i+1's time waiting for rollouts, `episode_ends` when each episode finished.

        >>> r = whole_run(0.0, [600.0, 1200.0], [500.0, 400.0], [300.0, 300.0, 900.0, 1500.0])
        >>> r["whole_run_steps_per_hour"], r["episodes"], r["episodes_per_hour"], r["steps"]
        (6.0, 3, 9.0, 2)
        >>> r["optimizer_idle_frac"], r["steady_state_steps_per_hour"]
        (0.75, 6.0)
    """
    span = step_ends[-1] - started
    episodes = sum(t <= step_ends[-1] for t in episode_ends)
    steady = step_ends[-1] - step_ends[0]
    return {"steps": len(step_ends), "whole_run_s": span,
            "whole_run_steps_per_hour": 3600 * len(step_ends) / span,
            "episodes": episodes, "episodes_per_hour": 3600 * episodes / span,
            "optimizer_idle_frac": sum(idle_s) / span,
            "steady_state_steps_per_hour": 3600 * (len(step_ends) - 1) / steady if steady
            else None}


def run_sync(args: argparse.Namespace, workdir: str) -> dict[str, float]:
    from trl import GRPOConfig, GRPOTrainer

    from harness_gym.integrations.trl import harness_reward, make_rollout_func, task_dataset

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir(), dtype=torch.float32)
    rollout = make_rollout_func(harness="pi", tasks="builtin", max_tokens=MAX_TOKENS,
                                episode_timeout_s=300)
    rollout_s: list[float] = []
    step_ends: list[float] = []
    episode_ends: list[float] = []

    def timed_rollout(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        started = time.monotonic()
        try:
            return rollout(prompts, trainer)
        finally:
            rollout_s.append(time.monotonic() - started)
            episode_ends.extend([time.monotonic()] * len(prompts))  # a batch ends together

    class StepEnds(TrainerCallback):
        def on_step_end(self, *a: Any, **kw: Any) -> None:
            step_ends.append(time.monotonic())

    config = GRPOConfig(
        output_dir=workdir, per_device_train_batch_size=args.batch, num_generations=args.group,
        max_steps=args.steps, learning_rate=1e-3, logging_steps=1, steps_per_generation=1,
        temperature=1.0, beta=0.0, max_completion_length=MAX_TOKENS, report_to="none",
        use_cpu=True, bf16=False, save_strategy="no", seed=0)
    trainer = GRPOTrainer(model=model, processing_class=load_tiny_tokenizer(), args=config,
                          train_dataset=task_dataset("builtin", repeat=args.steps * args.batch),
                          reward_funcs=[harness_reward, alternating_reward],
                          rollout_func=timed_rollout, callbacks=[StepEnds()])
    started = time.monotonic()
    try:
        trainer.train()
    finally:
        rollout.close()
    return {**whole_run(started, step_ends, rollout_s, episode_ends),
            "episodes_in_flight": args.batch}


def run_async(args: argparse.Namespace, workdir: str, *, lockstep: bool = False
              ) -> dict[str, float]:
    from trl.experimental.async_grpo import AsyncGRPOConfig

    from harness_gym.integrations.async_grpo import HarnessRolloutWorker
    from harness_gym.integrations.async_loop import AsyncGRPOLoop
    from harness_gym.integrations.weight_transfer import EngineWeightTransfer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir(), dtype=torch.float32)
    transfer = EngineWeightTransfer.serving_copy(model, load_tiny_tokenizer(), model_name="tiny",
                                                 tokenizer_source="tiny")
    per_step = args.batch // args.group
    # Lockstep: one step's groups per version, started after the step before (the sync schedule).
    # Async: as many in flight (no head start), unless --async-groups says otherwise.
    in_flight = per_step if lockstep else (args.async_groups or per_step)
    worker = HarnessRolloutWorker(
        "builtin", group_size=args.group, groups_in_flight=in_flight, harness="pi",
        max_groups_per_version=per_step if lockstep else None,
        engine=transfer.engine, sampling={"max_tokens": MAX_TOKENS, "temperature": 1.0},
        episode_timeout_s=300,
        reward_fn=lambda results: alternating_reward(results))
    config = AsyncGRPOConfig(
        output_dir=workdir, max_steps=args.steps, per_device_train_batch_size=args.batch,
        learning_rate=1e-3, max_staleness=args.max_staleness, use_cpu=True, report_to="none",
        save_strategy="no", bf16=False, seed=0, logging_steps=1)
    loop = AsyncGRPOLoop(model, config, worker, transfer)
    started = time.monotonic()
    try:
        loop.train()
    finally:
        transfer.engine.close()
    step_ends = [e["time"] for e in loop.events if e["kind"] == "step_end"]
    waits = [entry["perf/rollout_wait_s"] for entry in loop.log_history]
    episode_ends = [e["time"] for e in worker.events if e["kind"] == "group_end"
                    for _ in range(args.group)]
    return {**whole_run(started, step_ends, waits, episode_ends),
            "episodes_in_flight": in_flight * args.group,
            "dropped_stale": loop.counts["dropped_stale"]}


def report(mode: str, result: dict[str, Any]) -> None:
    print(f"cores {mode} (load average {result['load_average_after'][0]:.1f} at its end):")
    for name in ("sync", "lockstep", "async"):
        r = result[name]
        print(f"  {name:>8}: {r['whole_run_steps_per_hour']:7.1f} steps/h, "
              f"{r['episodes_per_hour']:7.1f} episodes/h over the whole run ({r['steps']} steps, "
              f"{r['episodes']} episodes, {r['episodes_in_flight']} in flight, "
              f"{r['whole_run_s']:.0f} s); optimiser idle {100 * r['optimizer_idle_frac']:5.1f} %")
    print(f"  whole run, async / sync steps per hour: {result['speedup']:.2f}x   async / "
          f"lockstep (same loop and loss): {result['speedup_same_loop']:.2f}x", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=MEASURED_STEPS,
                        help=f"optimiser steps per path (>= {MEASURED_STEPS} to measure)")
    parser.add_argument("--batch", type=int, default=4, help="rollouts (samples) per step")
    parser.add_argument("--group", type=int, default=2, help="GRPO group size")
    parser.add_argument("--max-staleness", type=int, default=2)
    parser.add_argument("--async-groups", type=int, default=None,
                        help="groups in flight on the async path (default batch / group: the "
                             "same episodes in flight as the other paths)")
    parser.add_argument("--cores", default="split",
                        help="placements to run, comma-separated: split, shared")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 2 steps, batch 2, group 2, shared cores")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.batch, args.group, args.cores = 2, 2, 2, "shared"
    if args.steps < 1 or args.batch % args.group:
        parser.error("--steps must be >= 1 and --batch a multiple of --group")
    if args.async_groups is not None and args.async_groups < 1:
        parser.error("--async-groups must be positive")
    modes = args.cores.split(",")
    if not set(modes) <= {"split", "shared"}:
        parser.error("--cores takes split and/or shared")
    if args.steps < MEASURED_STEPS:
        print(f"warning: {args.steps} steps per path is a smoke run, not a measurement "
              f"(>= {MEASURED_STEPS})", flush=True)
    results: dict[str, Any] = {
        "settings": {"steps": args.steps, "batch": args.batch, "group": args.group,
                     "max_staleness": args.max_staleness, "async_groups": args.async_groups,
                     "cores": modes, "cpu_count": os.cpu_count()},
        "load_average_before": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="async-vs-sync-") as workdir:
        for mode in modes:
            with placement(mode):
                sync = run_sync(args, os.path.join(workdir, mode, "sync"))
                lock = run_async(args, os.path.join(workdir, mode, "lockstep"), lockstep=True)
                asyn = run_async(args, os.path.join(workdir, mode, "async"))
            rate = "whole_run_steps_per_hour"
            results[mode] = {"sync": sync, "lockstep": lock, "async": asyn,
                             "speedup": asyn[rate] / sync[rate],
                             "speedup_same_loop": asyn[rate] / lock[rate],
                             "load_average_after": os.getloadavg()}
            report(mode, results[mode])
    print(f"(batch {args.batch}, group {args.group}, {args.steps} steps, max_staleness "
          f"{args.max_staleness}, on {os.cpu_count()} cores; load average "
          f"{results['load_average_before'][0]:.1f} at the start)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
