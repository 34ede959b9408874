"""The evaluation stages: a checkpoint's episodes on the held-out instances through the env.

`EvaluationStages` is a part of `learning_curve.Pipeline`: `run_episodes` samples a checkpoint
(the train-pass calibration uses it too), `evaluate` runs the held-out instances at the rollout
sampling and greedy, and a GRPO arm's points along its run alike.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from .config import ARMS
from .process import cpu_seconds
from .summary import brief


class EvaluationStages:
    """`eval-base`, `eval-sft`, `eval-grpo*` (a part of `Pipeline`)."""

    def run_episodes(self, name: str, tasks: list[Any], temperature: float, samples: int,
                     out_dir: Path, weights: Path | None = None) -> list[dict[str, Any]]:
        """`samples` episodes per task of checkpoint `name` (its weights, or `weights`) at
        `temperature` (resumable)."""
        from harness_gym.training.evaluation import run_tasks

        c = self.config
        weights = self.weights(weights) if weights is not None else self.checkpoint(name)
        if c.engine == "vllm":
            engine, own = self.server.serving(name, weights), False
        else:
            from harness_gym.engines import TransformersEngine

            engine = TransformersEngine.from_pretrained(weights, model_name="policy")
            own = True
        try:
            return run_tasks(
                tasks, self.episode_config(engine, temperature, c.max_tokens,
                                           seeded=samples == 1),
                out_dir=out_dir, num_envs=c.concurrent_episodes, progress=self.progress,
                resume=True, samples=samples)
        finally:
            if own:
                engine.close()

    def evaluate(self, name: str) -> dict[str, Any]:
        """Checkpoint `name` on the held-out instances, `eval_samples` at the rollout
        temperature and one greedy; a GRPO arm's points along its run alike."""
        from harness_gym.training.evaluation import summarize

        c = self.config
        tasks = self.tasks(c.heldout_suite, c.n_heldout)
        out = self.stage_dir(f"eval-{name}")

        def one(label: str, weights: Path | None, samples: int) -> dict[str, Any]:
            wall, cpu = time.monotonic(), cpu_seconds()
            sampled = self.run_episodes(name, tasks, c.grpo_temperature, samples,
                                        out / label / "sampled", weights)
            greedy = self.run_episodes(name, tasks, 0.0, 1, out / label / "greedy", weights)
            return {**summarize(sampled), "episodes": sampled,
                    "greedy": {**summarize(greedy), "episodes": greedy},
                    "episodes_run": len(sampled) + len(greedy),
                    "eval_s": time.monotonic() - wall, "eval_cpu_s": cpu_seconds() - cpu}

        points = []
        trained = self.done(name) if name in ARMS.values() else None
        for point in (trained or {}).get("points", []):
            label = f"step-{point['step']}"
            at = one(label, self.stage_dir(name) / "points" / label,
                     c.point_samples or c.eval_samples)
            points.append({"step": point["step"], "samples_per_instance":
                           at["samples_per_instance"], "n_episodes_run": at["episodes_run"],
                           **brief(at)})
        final = one("final", None, c.eval_samples)
        if trained is not None:
            points.append({"step": trained["optimizer_steps"],
                           "samples_per_instance": final["samples_per_instance"],
                           "n_episodes_run": final["episodes_run"], **brief(final)})
        summary = {k: v for k, v in final.items() if k != "episodes"}
        run = final["episodes_run"] + sum(
            p["n_episodes_run"] for p in points[:-1 if trained is not None else None])
        return {"summary": summary, "episodes": final["episodes"], "points": points,
                "episodes_total": run,
                "sampling": {"temperature": c.grpo_temperature, "top_p": c.grpo_top_p,
                             "top_k": c.grpo_top_k, "max_tokens": c.max_tokens,
                             "samples_per_instance": c.eval_samples, "greedy": 1},
                "server": self.server.stats()}
