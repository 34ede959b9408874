"""The same GRPO training budget, synchronous vs asynchronous, side by side in one run.

    python benchmarks/async_vs_sync.py [--steps 4] [--batch 4] [--group 2] [--max-staleness 2]

Both paths train the tiny model on real Pi episodes of the built-in tasks, `--batch` rollouts
per optimiser step in GRPO groups of `--group`, 32 tokens per model call:

- sync: TRL's `GRPOTrainer` with our `rollout_func` (`integrations/trl.py`); each step runs its
  batch of episodes, waits for the slowest, then optimises while no episode runs.
- async: `AsyncGRPOLoop` with `HarnessRolloutWorker` (`integrations/async_loop.py`); episodes run
  all the time, `max_staleness * batch` of them in flight (TRL's `max_inflight_tasks` rule), and
  the optimiser takes samples as they come.

Reported per path, over the steady state (from the end of step 1 to the end of the last step,
so engine, proxy and CLI start-up are left out): optimiser steps per hour and the optimiser's
idle fraction (time waiting for rollouts / wall time). Rewards alternate 1, 0 within a group
(the tiny model fails every task alike), so every step has a gradient; this does not change the
timing.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, TrainerCallback  # noqa: E402

from harness_gym.engines.tiny import load_tiny_tokenizer, tiny_model_dir  # noqa: E402

MAX_TOKENS = 32


def alternating_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    return [float(i % 2 == 0) for i in range(len(completions))]


def steady_state(step_ends: list[float], idle_s: list[float]) -> dict[str, float]:
    """Steps/hour and idle fraction from step 2 on; `idle_s[i]` is step i+1's waiting time."""
    span = step_ends[-1] - step_ends[0]
    return {"steps_per_hour": 3600 * (len(step_ends) - 1) / span,
            "optimizer_idle_frac": sum(idle_s[1:]) / span, "steady_state_s": span}


def run_sync(args: argparse.Namespace, workdir: str) -> dict[str, float]:
    from trl import GRPOConfig, GRPOTrainer

    from harness_gym.integrations.trl import harness_reward, make_rollout_func, task_dataset

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir(), dtype=torch.float32)
    rollout = make_rollout_func(harness="pi", tasks="builtin", max_tokens=MAX_TOKENS,
                                episode_timeout_s=300)
    rollout_s: list[float] = []
    step_ends: list[float] = []

    def timed_rollout(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        started = time.monotonic()
        try:
            return rollout(prompts, trainer)
        finally:
            rollout_s.append(time.monotonic() - started)

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
    return {**steady_state(step_ends, rollout_s), "wall_s": time.monotonic() - started}


def run_async(args: argparse.Namespace, workdir: str) -> dict[str, float]:
    from trl.experimental.async_grpo import AsyncGRPOConfig

    from harness_gym.integrations.async_grpo import HarnessRolloutWorker
    from harness_gym.integrations.async_loop import AsyncGRPOLoop
    from harness_gym.integrations.weight_transfer import EngineWeightTransfer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir(), dtype=torch.float32)
    transfer = EngineWeightTransfer.serving_copy(model, load_tiny_tokenizer(), model_name="tiny",
                                                 tokenizer_source="tiny")
    in_flight = max(args.max_staleness, 1) * args.batch // args.group
    worker = HarnessRolloutWorker(
        "builtin", group_size=args.group, groups_in_flight=in_flight, harness="pi",
        engine=transfer.engine, sampling={"max_tokens": MAX_TOKENS, "temperature": 1.0},
        episode_timeout_s=300,
        reward_fn=lambda results: alternating_reward(results))
    config = AsyncGRPOConfig(
        output_dir=workdir, max_steps=args.steps, per_device_train_batch_size=args.batch,
        learning_rate=1e-3, max_staleness=args.max_staleness, use_cpu=True, report_to="none",
        save_strategy="no", bf16=False, seed=0)
    loop = AsyncGRPOLoop(model, config, worker, transfer)
    started = time.monotonic()
    try:
        loop.train()
    finally:
        transfer.engine.close()
    step_ends = [e["time"] for e in loop.events if e["kind"] == "step_end"]
    waits = [entry["perf/rollout_wait_s"] for entry in loop.log_history]
    dropped = sum(entry.get("staleness/dropped_total", 0) for entry in loop.log_history)
    return {**steady_state(step_ends, waits), "wall_s": time.monotonic() - started,
            "episodes_in_flight": in_flight * args.group, "dropped_stale": dropped}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4, help="optimiser steps per path (>= 2)")
    parser.add_argument("--batch", type=int, default=4, help="rollouts (samples) per step")
    parser.add_argument("--group", type=int, default=2, help="GRPO group size")
    parser.add_argument("--max-staleness", type=int, default=2)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    if args.steps < 2 or args.batch % args.group:
        parser.error("--steps must be >= 2 and --batch a multiple of --group")
    results = {}
    with tempfile.TemporaryDirectory(prefix="async-vs-sync-") as workdir:
        results["sync"] = run_sync(args, os.path.join(workdir, "sync"))
        results["async"] = run_async(args, os.path.join(workdir, "async"))
    results["speedup"] = results["async"]["steps_per_hour"] / results["sync"]["steps_per_hour"]
    results["load_average"] = os.getloadavg()
    for name in ("sync", "async"):
        r = results[name]
        print(f"{name:>5}: {r['steps_per_hour']:7.1f} steps/h   optimiser idle "
              f"{100 * r['optimizer_idle_frac']:5.1f} %   steady state {r['steady_state_s']:.0f} s"
              f" of {r['wall_s']:.0f} s")
    print(f"async / sync steps per hour: {results['speedup']:.2f}x  (batch {args.batch}, group "
          f"{args.group}, {args.steps} steps, max_staleness {args.max_staleness}; load average "
          f"{results['load_average'][0]:.1f} on {os.cpu_count()} cores)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
