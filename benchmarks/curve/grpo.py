"""The GRPO stages: the learning-rate sweep and the arms, each from the SFT checkpoint.

`GrpoStages` is a part of `learning_curve.Pipeline` (its configuration, stage folders, server
and state); a rate's or an arm's run resumes from its trainer checkpoint, the step it was cut in
replayed from its journal (`curve.journal`). A finished run's trainer checkpoint is dropped
(`Pipeline.drop_trainer`): the weights it ends with are in `model/` (and its points in
`points/`), its figures in the stage's metrics or the rate's `run.json`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from .config import arm_reward
from .journal import JournaledRollout, PointSaver, StepTimer, points_of, train_resumed
from .process import cpu_seconds, log
from .summary import sweep_score


class GrpoStages:
    """`lr-sweep`, `grpo`, `grpo-nopenalty`, `grpo-flat` (a part of `Pipeline`)."""

    def stage_lr_sweep(self) -> dict[str, Any]:
        c = self.config
        rates = [float(x) for x in c.lr_sweep.split(",") if x.strip()]
        runs = []
        for rate in rates:
            out = self.stage_dir("lr-sweep") / f"lr-{rate:g}"
            kept = out / "run.json"
            if kept.exists():
                runs.append(json.loads(kept.read_text()))
                continue
            wall, cpu = time.monotonic(), cpu_seconds()
            trained = self.train_grpo(out, arm_reward("grpo", c.tool_penalty), rate,
                                      c.lr_sweep_steps, keep_model=False)
            run = {"learning_rate": rate, "steps": trained["steps"],
                   "score": sweep_score(trained["steps"]),
                   "wall_s": time.monotonic() - wall, "cpu_s": cpu_seconds() - cpu}
            kept.write_text(json.dumps(run))
            self.drop_trainer(out)  # a rate's run is done once run.json says so
            runs.append(run)
            log(f"lr-sweep {rate:g}: score {run['score']}")
        scored = [r for r in runs if r["score"] is not None]
        pick = (max(scored, key=lambda r: r["score"])["learning_rate"] if scored
                else c.grpo_learning_rate or (rates[0] if rates else 1e-5))
        return {"runs": runs, "pick": pick,
                "criterion": "mean rollout reward after each run's first step"}

    def arm_learning_rate(self) -> float:
        if self.config.grpo_learning_rate > 0:
            return self.config.grpo_learning_rate
        sweep = self.done("lr-sweep")
        if sweep is None:
            raise SystemExit("grpo_learning_rate=0 takes the lr-sweep's pick: run lr-sweep")
        return float(sweep["pick"])

    def train_arm(self, stage: str) -> dict[str, Any]:
        """One GRPO arm from the SFT checkpoint, its reward per `arm_reward`."""
        c = self.config
        rate = self.arm_learning_rate()
        out = self.train_grpo(self.stage_dir(stage), arm_reward(stage, c.tool_penalty), rate,
                              c.grpo_steps, eval_every=c.grpo_eval_every)
        return {**out, "learning_rate": rate}

    def train_grpo(self, out: Path, reward: dict[str, Any], learning_rate: float, steps: int,
                   *, eval_every: int = 0, keep_model: bool = True) -> dict[str, Any]:
        """GRPO from the SFT checkpoint into `out` (resumable); every `eval_every` steps the
        weights are saved under `out/points/step-N` for the evaluation."""
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from trl import GRPOConfig

        from harness_gym.integrations.trl import harness_reward, make_rollout_func, task_dataset
        from harness_gym.training.lora import is_adapter_dir, load_adapter
        from harness_gym.training.trainers import FrozenPrefixGRPOTrainer

        c = self.config
        start = self.stage_dir("sft") / "model"
        if is_adapter_dir(start):  # LoRA: GRPO goes on training the SFT adapter
            base = AutoModelForCausalLM.from_pretrained(self.base_dir(), dtype="float32")
            model = load_adapter(base, start, trainable=True)
            tokenizer = AutoTokenizer.from_pretrained(self.base_dir())
        else:
            model = AutoModelForCausalLM.from_pretrained(start, dtype="float32")
            tokenizer = AutoTokenizer.from_pretrained(start)
        train_tasks = self.train_tasks()
        served = self.server.for_training() if c.engine == "vllm" else {}
        rollout = make_rollout_func(
            harness=c.harness, tasks=train_tasks, max_tokens=c.max_tokens, sandbox=c.sandbox,
            reward=reward, episode_timeout_s=c.episode_timeout_s,
            max_model_calls=c.max_model_calls or None,
            dynamic_sampling=c.grpo_dynamic_draws or None, **served)
        logged = JournaledRollout(rollout, out, c.grpo_group_size)
        args = GRPOConfig(
            # one row a pass: the frozen-prefix scorer runs rows one at a time anyway, and each
            # row's graph is freed by its own backward (a step's peak memory is its longest
            # row's, not the sum: 20 GB -> 9 GB on grpo-flat's step 15). TRL's default "dapo"
            # loss divides by the whole step's tokens, so the gradient is the same.
            output_dir=str(out / "trainer"), per_device_train_batch_size=1,
            num_generations=c.grpo_group_size,
            gradient_accumulation_steps=c.grpo_group_size * c.grpo_groups_per_step,
            max_steps=steps, learning_rate=learning_rate,
            lr_scheduler_type="constant", temperature=c.grpo_temperature, top_p=c.grpo_top_p,
            top_k=c.grpo_top_k, beta=0.0,
            max_completion_length=c.max_tokens, logging_steps=1, save_strategy="steps",
            save_steps=c.grpo_save_steps, save_total_limit=1, report_to="none", use_cpu=True,
            bf16=False, activation_checkpointing=False, seed=c.seed)
        timer = StepTimer()
        callbacks = [timer] + ([PointSaver(out / "points", eval_every, steps, tokenizer)]
                               if eval_every else []) + self.state_callbacks()
        trainer = FrozenPrefixGRPOTrainer(
            model=model, processing_class=tokenizer, args=args,
            train_dataset=task_dataset(train_tasks), reward_funcs=harness_reward,
            rollout_func=logged, callbacks=callbacks)
        try:
            train_resumed(trainer, out / "trainer")
        finally:
            rollout.close()
            self.server.forget()  # the server now holds this run's weights
        if keep_model:
            trainer.save_model(out / "model")
            tokenizer.save_pretrained(out / "model")
        records = logged.read()
        for record in records:  # a step's time beyond its rollout was the optimisation
            wall, cpu = timer.by_step.get(record["step"], (None, None))
            record["train_s"] = None if wall is None else max(0.0, wall - record["rollout_s"])
            record["train_cpu_s"] = None if cpu is None else max(0.0, cpu - record["rollout_cpu_s"])
        return {"steps": records, "optimizer_steps": trainer.state.global_step,
                "reward": reward, "points": points_of(out),
                "log_history": trainer.state.log_history, **trainer.frozen_prefix_stats()}

