"""The learning curve: a policy trained through the real Pi CLI, from the env's own traces.

    python benchmarks/learning_curve.py --quick            # tiny-vllm on a real vLLM server
    python benchmarks/learning_curve.py --preset calibrate # SmolLM2, timed slices of each stage
    python benchmarks/learning_curve.py --preset full      # the full run (SmolLM2, see `plan`)

The full run is started in the background, and resumed by running the very same command again
(it refuses a workdir whose recorded configuration differs):

    cd /work/wt/learn && nohup nice -n 10 ./.venv/bin/python benchmarks/learning_curve.py \
        --preset full --workdir ~/.cache/harness-gym/learning-curve/full --no-progress \
        >> /tmp/learning_full.log 2>&1 &

The committed calibration (`learning_curve_calibrate.json`) was cut at the session's end; it is
completed (and its `plan` filled in) by resuming it alike:

    ./.venv/bin/python benchmarks/learning_curve.py --preset calibrate \
        --workdir ~/.cache/harness-gym/learning-curve/calibrate-v4 --no-progress

Stages, each writing its checkpoint and `metrics.json` under `--workdir` and skipped when that
file exists. A run killed at any moment resumes when the same command runs again, losing minutes
at most: demos and evaluations record each episode as it ends and run only the missing ones
(`run_tasks(resume=True)`), SFT resumes from its trainer checkpoint (every `sft_save_steps`
optimizer steps), GRPO from its checkpoint (every step) with the groups of the step it was cut in
replayed from their journal (`JournaledRollout`). The process id is in `run.pid`.

With `engine="vllm"` (every preset) ONE vLLM CPU server (`VLLMServer`, started by the pipeline at
the first stage that samples from the policy, stopped when the run ends, whatever way it ends)
serves the GRPO rollouts and every evaluation: each GRPO step's rollouts sample from the trainer's
weights, pushed into the server before them (`make_rollout_func(weight_sync=...)`), and each
checkpoint's evaluation first loads its weights into the server (`VLLMWeightTransfer.push`).
`engine="inprocess"` is the older path (the trainer's own model; a `TransformersEngine`).

1. `demos`: the teacher engine (`teacher:<policy>,churn=F`: needless `ls`, re-reads and test runs
   on a fraction F of its episodes) solves `train_suite` tasks through Pi; `RecordTraces` keeps
   every episode (JSON Lines).
2. `sft`: the policy fine-tuned on the passing episodes' agent segments, token for token with
   `loss_mask` as the label mask (`harness_gym.training.sft`, frozen shared prompt prefix).
3. `train-pass`: the calibration of the tier: the SFT policy at the rollout temperature on
   `n_calib_tasks` training tasks (not demonstrated) x `calib_samples`: its pass rate, per bug
   kind, and whether it is in the learnable zone (20-70%). The tier's difficulty knobs are
   config: `train_suite`/`heldout_suite` (the one-file family or the symptom tier) and
   `task_kinds` (the bug kinds GRPO trains on).
4. `lr-sweep`: `lr_sweep_steps` gated-GRPO steps from SFT per learning rate of `lr_sweep`, each
   logged; the pick is the rate whose rollouts after its first step earned the most reward
   (the first step's rollouts all sample the SFT weights). `grpo_learning_rate` 0 takes it.
5. `grpo`, `grpo-nopenalty`, `grpo-flat` (the arms `grpo_arms` names): TRL `GRPOTrainer`
   (`FrozenPrefixGRPOTrainer`) with `make_rollout_func`, each from the SFT checkpoint with the
   same budget; the reward is the env's test-gated reward with a tool penalty (`grpo`), without
   one (`grpo-nopenalty`), or the flat penalty that teaches quitting (`grpo-flat`); with
   `grpo_dynamic_draws` > 0, groups with zero reward variance are refilled (dynamic sampling;
   counts in each step's record). Every `grpo_eval_every` steps the weights are kept as a point.
6. `eval-base`, `eval-sft`, `eval-grpo*`: each checkpoint (and each arm's points) on
   `n_heldout` held-out instances through Pi, `eval_samples` episodes each at the rollout
   temperature plus one greedy: pass@1 (mean over samples) with a 95% bootstrap interval over
   instances, tool calls on solved episodes, quit rate, outcome counts; the results' `summary`
   holds the headline figures (the gated arm's gain over SFT with a paired bootstrap interval).

Results (every figure, the exact configuration, per-stage wall and CPU time) go to
`--results`/learning_curve[_MODE].json with the plot beside it as PNG, and the full preset's
`plan`: its expected time per stage from the calibration run's per-unit times.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
# GRPO arms, all from the SFT checkpoint with the same budget: `grpo` is the test-gated tool
# penalty (the default reward), `grpo-nopenalty` has lambda = 0, `grpo-flat` the flat penalty
# (`RewardConfig(penalty="flat")`, the quitting trap). `grpo_arms` picks which run.
ARMS = {"gated": "grpo", "nopenalty": "grpo-nopenalty", "flat": "grpo-flat"}
STAGES = ("demos", "sft", "train-pass", "lr-sweep", *ARMS.values(), "eval-base", "eval-sft",
          *(f"eval-{stage}" for stage in ARMS.values()))
# The results' `summary` names each checkpoint by its arm.
SUMMARY_NAMES = {"base": "base", "sft": "sft", "grpo": "grpo_gated",
                 "grpo-nopenalty": "grpo_nopenalty", "grpo-flat": "grpo_flat"}
# The learnable zone: the SFT policy's pass rate at the rollout temperature on training tasks.
ZONE = (0.20, 0.70)
BUDGET_S = 10 * 3600  # the budget for the whole experiment on this machine


@dataclass(frozen=True)
class CurveConfig:
    """Every size, rate and sampling setting of a run (recorded whole in the results)."""

    mode: str
    policy: str  # "tiny", "tiny-vllm", "smollm2" or a model directory
    teacher: str  # the teacher engine spec
    harness: str = "pi"
    sandbox: str | None = None  # None: the env's default (bwrap where it works)
    engine: str = "vllm"  # "vllm": one vLLM CPU server for the run; "inprocess"
    vllm_max_model_len: int = 8192
    vllm_kv_cache_gib: int = 2
    # the tier and its difficulty knobs
    train_suite: str = "family-symptom:train"
    heldout_suite: str = "family-symptom:heldout"
    task_kinds: str = ""  # comma-separated bug kinds GRPO trains on; "" all
    n_demo_tasks: int = 4
    n_heldout: int = 2
    concurrent_episodes: int = 8
    episode_timeout_s: float = 240.0
    max_tokens: int = 24  # per model call of the policy
    demo_max_tokens: int = 1024  # per model call of the teacher (its turns are never cut)
    # SFT
    sft_epochs: float = 1.0
    sft_learning_rate: float = 1e-3
    sft_grad_accum: int = 1
    sft_max_length: int = 8192
    sft_save_steps: int = 5  # optimizer steps between resumable checkpoints
    # calibration of the tier: the SFT policy on training tasks at the rollout temperature
    n_calib_tasks: int = 2
    calib_samples: int = 2
    # the learning-rate sweep (gated reward); "" none
    lr_sweep: str = ""
    lr_sweep_steps: int = 2
    # GRPO
    grpo_steps: int = 1
    grpo_group_size: int = 4
    grpo_groups_per_step: int = 1
    grpo_learning_rate: float = 1e-4  # 0: the sweep's pick
    grpo_temperature: float = 1.0  # the rollout temperature (evaluation samples use it too)
    grpo_save_steps: int = 1
    grpo_eval_every: int = 0  # keep the weights every N steps as an evaluated point; 0 none
    grpo_arms: str = "gated"  # comma-separated, of ARMS
    grpo_dynamic_draws: int = 0  # dynamic sampling: extra groups per zero-variance batch; 0 off
    tool_penalty: float = 0.05
    # evaluation: eval_samples episodes per instance at grpo_temperature, plus one greedy
    eval_samples: int = 2
    point_samples: int = 0  # samples per instance at a point along a GRPO run; 0: eval_samples
    seed: int = 0


PRESETS: dict[str, CurveConfig] = {
    # The tiny random model on a real vLLM server: proves every stage runs and computes its
    # metrics (two GRPO steps per arm, so each arm has a point along its run).
    "quick": CurveConfig(mode="quick", policy="tiny-vllm", teacher="teacher:tiny,score=0",
                         vllm_kv_cache_gib=1, sft_save_steps=2,
                         lr_sweep="1e-4,1e-3", lr_sweep_steps=1, grpo_learning_rate=0.0,
                         grpo_steps=2, grpo_eval_every=1, grpo_arms="gated,nopenalty,flat",
                         grpo_dynamic_draws=1),
    # SmolLM2 with a handful of each unit: the per-unit times that size the full run.
    # (Half an SFT epoch, one arm, one swept rate, one step each: the arms cost alike per
    # episode; it times the units on a machine shared by six, the full run calibrates the tier.)
    "calibrate": CurveConfig(
        mode="calibrate", policy="smollm2", teacher="teacher:smollm2,churn=0.6",
        n_demo_tasks=8, n_heldout=2, max_tokens=192, episode_timeout_s=600, sft_epochs=0.5,
        sft_learning_rate=1e-4, n_calib_tasks=4, calib_samples=2, lr_sweep="1e-5",
        lr_sweep_steps=1, grpo_learning_rate=0.0, grpo_steps=1, grpo_temperature=0.8,
        grpo_arms="gated", grpo_dynamic_draws=1, eval_samples=2),
    # The full run, sized from the calibration (its results' `plan`) to the issue's floors: 30
    # GRPO steps per arm of one group of 4 (dynamic sampling refills up to 2 more), 50
    # held-out instances x 4 samples plus greedy per checkpoint, one point mid-run per arm
    # (1 sample plus greedy); the rest of the 10 h goes to SFT data.
    "full": CurveConfig(
        mode="full", policy="smollm2", teacher="teacher:smollm2,churn=0.6", n_demo_tasks=100,
        vllm_kv_cache_gib=3,
        n_heldout=50, max_tokens=192, episode_timeout_s=900,
        sft_epochs=2, sft_learning_rate=1e-4, sft_grad_accum=4, sft_save_steps=3,
        n_calib_tasks=24, calib_samples=2, lr_sweep="5e-6,2e-5", lr_sweep_steps=3,
        grpo_learning_rate=0.0, grpo_steps=30, grpo_group_size=4, grpo_groups_per_step=1,
        grpo_temperature=0.8, grpo_eval_every=15, tool_penalty=0.05,
        grpo_arms="gated,nopenalty,flat", grpo_dynamic_draws=2, eval_samples=4,
        point_samples=1),
}


def arm_stages(config: CurveConfig) -> list[str]:
    """The GRPO stages `config.grpo_arms` names, in ARMS order."""
    arms = [a.strip() for a in config.grpo_arms.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms:
        raise SystemExit(f"grpo_arms={config.grpo_arms!r}: a comma-separated subset of "
                         f"{', '.join(ARMS)}")
    return [stage for arm, stage in ARMS.items() if arm in arms]


def arm_reward(stage: str, tool_penalty: float) -> dict[str, Any]:
    """The `RewardConfig` fields of a GRPO arm (the held-out evaluations score all alike)."""
    if stage == ARMS["nopenalty"]:
        return {"tool_penalty": 0.0}
    if stage == ARMS["flat"]:
        return {"tool_penalty": tool_penalty, "penalty": "flat"}
    return {"tool_penalty": tool_penalty}


def wanted(stages: list[str], config: CurveConfig) -> list[str]:
    """`stages` less the GRPO arms (and their evaluations) the configuration does not run."""
    arms = arm_stages(config)
    skipped = {s for s in ARMS.values() if s not in arms}
    return [s for s in stages if s not in skipped and s.removeprefix("eval-") not in skipped]


class Pipeline:
    def __init__(self, config: CurveConfig, workdir: Path, results_dir: Path, *,
                 progress: bool = True) -> None:
        self.config = config
        self.workdir = workdir
        self.results_dir = results_dir
        self.progress = progress

    # --- resume bookkeeping -----------------------------------------------------------------

    def check_workdir(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        recorded = self.workdir / "config.json"
        mine = dataclasses.asdict(self.config)
        if recorded.exists():
            theirs = json.loads(recorded.read_text())
            defaults = {f.name: f.default for f in dataclasses.fields(CurveConfig)}
            changed = sorted(k for k in mine.keys() | theirs.keys()
                             if mine.get(k) != theirs.get(k, defaults.get(k)))
            if changed:  # (a field added since the run started counts at its default)
                raise SystemExit(f"{self.workdir} holds a run with another configuration "
                                 f"(differs in {', '.join(changed)}): resume it with the same "
                                 "settings, or pass another --workdir")
        else:
            recorded.write_text(json.dumps(mine, indent=2))

    def stage_dir(self, stage: str) -> Path:
        return self.workdir / stage

    def done(self, stage: str) -> dict[str, Any] | None:
        path = self.stage_dir(stage) / "metrics.json"
        return json.loads(path.read_text()) if path.exists() else None

    def finish(self, stage: str, metrics: dict[str, Any], started: tuple[float, float],
               load: tuple, server_cpu: float) -> None:
        wall, cpu = started
        # cpu_s: this process and its finished children (CLIs, graders); server_cpu_s: the
        # vLLM server's processes over the stage (it is no finished child until the run ends)
        metrics = {**metrics, "wall_s": time.monotonic() - wall, "cpu_s": cpu_seconds() - cpu,
                   "server_cpu_s": self.server.cpu_seconds() - server_cpu,
                   "threads": torch_threads(), "load_avg_start": list(load),
                   "load_avg_end": list(os.getloadavg())}
        path = self.stage_dir(stage) / "metrics.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(metrics, indent=2))
        tmp.replace(path)  # atomic: a half-written file never marks a stage done

    def run(self, stages: list[str]) -> dict[str, Any]:
        if not stages and not (self.workdir / "config.json").exists():
            raise SystemExit(f"{self.workdir} holds no run to report on")
        self.check_workdir()
        stages = wanted(stages, self.config)
        (self.workdir / "run.pid").write_text(f"{os.getpid()}\n")
        if any(self.done(stage) is None for stage in stages):
            preload()
        try:
            for stage in stages:
                if self.done(stage) is not None:
                    log(f"{stage}: done earlier, skipped")
                    continue
                log(f"{stage}: starting")
                self.stage_dir(stage).mkdir(parents=True, exist_ok=True)
                started, load = (time.monotonic(), cpu_seconds()), os.getloadavg()
                server_cpu = self.server.cpu_seconds()
                runner = getattr(self, "stage_" + stage.replace("-", "_"))
                self.finish(stage, runner(), started, load, server_cpu)
                log(f"{stage}: done in {time.monotonic() - started[0]:.0f} s "
                    f"({cpu_seconds() - started[1]:.0f} CPU s)")
        finally:
            self.server.close()  # the run's vLLM server: stopped however the run ends
        return self.write_results()

    # --- models -------------------------------------------------------------------------------

    def base_dir(self) -> Path:
        if self.config.policy == "tiny":
            from harness_gym.engines.tiny import tiny_model_dir

            return tiny_model_dir()
        from harness_gym.engines.vllm_server import resolve_model_dir

        return resolve_model_dir(self.config.policy)  # tiny-vllm, smollm2 or a directory

    def checkpoint(self, name: str) -> Path:
        return self.base_dir() if name == "base" else self.stage_dir(name) / "model"

    def episode_config(self, engine: Any, temperature: float, max_tokens: int, *,
                       seeded: bool = True) -> Any:
        """Episodes of `engine`; `seeded=False` for several samples of one instance (a seed
        would make a server's samples of the same prompt identical)."""
        from harness_gym.config import EpisodeConfig

        c = self.config
        sampling = {"temperature": temperature, "max_tokens": max_tokens}
        if seeded:
            sampling["seed"] = c.seed
        return EpisodeConfig(
            harness=c.harness, engine=engine, sandbox=c.sandbox,
            reward={"tool_penalty": c.tool_penalty}, episode_timeout_s=c.episode_timeout_s,
            sampling=sampling, progress=False)

    def tasks(self, suite: str, n: int, *, start: int = 0) -> list[Any]:
        from harness_gym.tasks import load_tasks

        return load_tasks(suite)[start:start + n]

    def train_tasks(self) -> list[Any]:
        """The tasks GRPO draws from: the training split, of `task_kinds` when it names some."""
        kinds = {k.strip() for k in self.config.task_kinds.split(",") if k.strip()}
        tasks = self.tasks(self.config.train_suite, 10**9)
        if kinds:
            tasks = [t for t in tasks if task_kind(t) in kinds]
            if not tasks:
                raise SystemExit(f"task_kinds={self.config.task_kinds!r} keeps no task of "
                                 f"{self.config.train_suite}")
        return tasks

    @property
    def server(self) -> PolicyServer:
        if getattr(self, "_server", None) is None:
            self._server = PolicyServer(self)
        return self._server

    # --- stages -------------------------------------------------------------------------------

    def stage_demos(self) -> dict[str, Any]:
        from harness_gym.engines import load_engine
        from harness_gym.training.evaluation import run_tasks, summarize

        c = self.config
        teacher = load_engine(c.teacher)
        try:
            episodes = run_tasks(
                self.tasks(c.train_suite, c.n_demo_tasks),
                self.episode_config(teacher, 0.0, c.demo_max_tokens),
                out_dir=self.stage_dir("demos") / "traces", num_envs=c.concurrent_episodes,
                progress=self.progress, resume=True)
        finally:
            teacher.close()
        durations = [e["duration_s"] for e in episodes]
        return {"summary": summarize(episodes), "episodes": episodes,
                "tool_calls_passed": tool_call_counts(episodes),
                "episode_s_mean": sum(durations) / len(durations)}

    def stage_sft(self) -> dict[str, Any]:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from harness_gym.training.sft import sft_rows, sft_trainer

        c = self.config
        rows = sft_rows(self.stage_dir("demos") / "traces", max_length=c.sft_max_length)
        if not rows:
            raise SystemExit("no passing demonstration to train on: see demos/metrics.json")
        base = self.base_dir()
        model = AutoModelForCausalLM.from_pretrained(base, dtype="float32")
        tokenizer = AutoTokenizer.from_pretrained(base)
        out = self.stage_dir("sft")
        timer = StepTimer()
        trainer = sft_trainer(
            model, tokenizer, rows, output_dir=out / "trainer", frozen_prefix=True,
            num_train_epochs=c.sft_epochs, learning_rate=c.sft_learning_rate,
            gradient_accumulation_steps=c.sft_grad_accum, seed=c.seed,
            save_strategy="steps", save_steps=c.sft_save_steps, save_total_limit=1)
        trainer.add_callback(timer)
        trainer.train(resume_from_checkpoint=last_checkpoint(out / "trainer"))
        trainer.save_model(out / "model")
        tokenizer.save_pretrained(out / "model")
        losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
        lengths = [len(r["input_ids"]) for r in rows]
        return {
            "rows": len(rows), "row_tokens_mean": sum(lengths) / len(lengths),
            "loss_tokens": sum(sum(x != -100 for x in r["labels"]) for r in rows),
            "optimizer_steps": trainer.state.global_step, "losses": losses,
            "step_s": timer.times, "step_cpu_s": timer.cpu_times,
            **trainer.frozen_prefix_stats()}

    def stage_train_pass(self) -> dict[str, Any]:
        """The tier's calibration: the SFT policy at the rollout temperature on training tasks
        it was not shown, `calib_samples` each."""
        from harness_gym.training.evaluation import instance_pass_rates, summarize

        c = self.config
        tasks = self.tasks(c.train_suite, c.n_calib_tasks, start=c.n_demo_tasks)
        if len(tasks) < c.n_calib_tasks:  # a small split: the demonstrated tasks too
            tasks = self.tasks(c.train_suite, c.n_calib_tasks)
        episodes = self.run_episodes("sft", tasks, c.grpo_temperature, c.calib_samples,
                                     self.stage_dir("train-pass") / "traces")
        summary = summarize(episodes)
        rates = instance_pass_rates(episodes)
        kinds = {t.instance_id: task_kind(t) for t in tasks}
        by_kind: dict[str, list[float]] = {}
        for task_id, rate in rates.items():
            by_kind.setdefault(kinds.get(task_id) or "?", []).append(rate)
        return {"summary": summary, "episodes": episodes, "zone": list(ZONE),
                "in_zone": ZONE[0] <= summary["pass_at_1"] <= ZONE[1],
                "pass_rate_by_kind": {k: sum(v) / len(v) for k, v in sorted(by_kind.items())},
                "temperature": c.grpo_temperature, "samples_per_instance": c.calib_samples}

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

    def stage_grpo(self) -> dict[str, Any]:
        return self.train_arm("grpo")

    def stage_grpo_nopenalty(self) -> dict[str, Any]:
        return self.train_arm("grpo-nopenalty")

    def stage_grpo_flat(self) -> dict[str, Any]:
        return self.train_arm("grpo-flat")

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
        from harness_gym.training.trainers import FrozenPrefixGRPOTrainer

        c = self.config
        start = self.checkpoint("sft")
        model = AutoModelForCausalLM.from_pretrained(start, dtype="float32")
        tokenizer = AutoTokenizer.from_pretrained(start)
        train_tasks = self.train_tasks()
        served = self.server.for_training() if c.engine == "vllm" else {}
        rollout = make_rollout_func(
            harness=c.harness, tasks=train_tasks, max_tokens=c.max_tokens, sandbox=c.sandbox,
            reward=reward, episode_timeout_s=c.episode_timeout_s,
            dynamic_sampling=c.grpo_dynamic_draws or None, **served)
        logged = JournaledRollout(rollout, out, c.grpo_group_size)
        args = GRPOConfig(
            output_dir=str(out / "trainer"), per_device_train_batch_size=c.grpo_group_size,
            num_generations=c.grpo_group_size, gradient_accumulation_steps=c.grpo_groups_per_step,
            max_steps=steps, learning_rate=learning_rate,
            lr_scheduler_type="constant", temperature=c.grpo_temperature, beta=0.0,
            max_completion_length=c.max_tokens, logging_steps=1, save_strategy="steps",
            save_steps=c.grpo_save_steps, save_total_limit=1, report_to="none", use_cpu=True,
            bf16=False, activation_checkpointing=False, seed=c.seed)
        timer = StepTimer()
        callbacks = [timer] + ([PointSaver(out / "points", eval_every, steps, tokenizer)]
                               if eval_every else [])
        trainer = FrozenPrefixGRPOTrainer(
            model=model, processing_class=tokenizer, args=args,
            train_dataset=task_dataset(train_tasks), reward_funcs=harness_reward,
            rollout_func=logged, callbacks=callbacks)
        try:
            trainer.train(resume_from_checkpoint=last_checkpoint(out / "trainer"))
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

    def run_episodes(self, name: str, tasks: list[Any], temperature: float, samples: int,
                     out_dir: Path, weights: Path | None = None) -> list[dict[str, Any]]:
        """`samples` episodes per task of checkpoint `name` (its weights, or `weights`) at
        `temperature` (resumable)."""
        from harness_gym.training.evaluation import run_tasks

        c = self.config
        if c.engine == "vllm":
            engine, own = self.server.serving(name, weights or self.checkpoint(name)), False
        else:
            from harness_gym.engines import TransformersEngine

            engine = TransformersEngine.from_pretrained(weights or self.checkpoint(name),
                                                        model_name="policy")
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
                "sampling": {"temperature": c.grpo_temperature, "max_tokens": c.max_tokens,
                             "samples_per_instance": c.eval_samples, "greedy": 1},
                "server": self.server.stats()}

    def stage_eval_base(self) -> dict[str, Any]:
        return self.evaluate("base")

    def stage_eval_sft(self) -> dict[str, Any]:
        return self.evaluate("sft")

    def stage_eval_grpo(self) -> dict[str, Any]:
        return self.evaluate("grpo")

    def stage_eval_grpo_nopenalty(self) -> dict[str, Any]:
        return self.evaluate("grpo-nopenalty")

    def stage_eval_grpo_flat(self) -> dict[str, Any]:
        return self.evaluate("grpo-flat")

    # --- results ------------------------------------------------------------------------------

    def plan(self, results: dict[str, Any]) -> dict[str, Any] | None:
        """The full preset's plan: from this run when it is the calibration (all its stages
        done), else from the committed calibration results."""
        calibration = results if self.config.mode == "calibrate" else None
        if calibration is None:
            path = self.results_dir / "learning_curve_calibrate.json"
            calibration = json.loads(path.read_text()) if path.exists() else None
        if calibration is None or self.config.mode == "quick":
            return None
        try:
            return {"from": "learning_curve_calibrate.json", **plan(PRESETS["full"], calibration)}
        except (KeyError, ZeroDivisionError, ValueError):
            # the calibration is not complete yet: the units it has measured
            return {"from": "learning_curve_calibrate.json", "complete": False,
                    "units_measured": measured_units(calibration)}

    @property
    def results_name(self) -> str:
        mode = self.config.mode
        return "learning_curve" if mode == "full" else f"learning_curve_{mode}"

    def write_results(self) -> dict[str, Any]:
        from harness_gym.training.report import plot_learning_curve, results_table

        stages: dict[str, Any] = {"eval": {}}
        for stage in STAGES:
            metrics = self.done(stage)
            if metrics is None:
                continue
            if stage.startswith("eval-"):
                summary = metrics.pop("summary")
                stages["eval"][stage[5:]] = {**summary, **metrics}
            else:
                stages[stage] = metrics
        results = {"mode": self.config.mode, "config": dataclasses.asdict(self.config),
                   "machine": {"cores": os.cpu_count()}, "stages": stages}
        results["times"] = {stage: {"wall_s": m["wall_s"], "cpu_s": m["cpu_s"]}
                            for stage in STAGES if (m := self.done(stage)) is not None}
        total = {k: sum(t[k] for t in results["times"].values()) for k in ("wall_s", "cpu_s")}
        results["times_total"] = {**total, "wall_h": round(total["wall_s"] / 3600, 2),
                                  "cpu_h": round(total["cpu_s"] / 3600, 2)}
        calib = stages.get("train-pass")
        results["calibration"] = None if calib is None else {
            "sft_train_pass_at_temperature": calib["summary"]["pass_at_1"],
            "ci": calib["summary"]["pass_at_1_ci"], "zone": calib["zone"],
            "in_zone": calib["in_zone"], "by_kind": calib["pass_rate_by_kind"],
            "temperature": calib["temperature"], "episodes": calib["summary"]["n_episodes"]}
        results["summary"] = headline_summary(stages["eval"])
        results["paired"] = paired_table(stages["eval"])
        results["targets"] = targets(stages["eval"])
        results["plan"] = self.plan(results)
        self.results_dir.mkdir(parents=True, exist_ok=True)
        name = self.results_name
        (self.results_dir / f"{name}.json").write_text(json.dumps(results, indent=1))
        if len(stages) > 1:  # a stage done: the plot says what there is (no stale one)
            plot_learning_curve(results, self.results_dir / f"{name}.png")
            log("\n" + results_table(results))
        return results


def plan(config: CurveConfig, calibration: dict[str, Any]) -> dict[str, Any]:
    """The full run's expected wall time per stage, from a calibrate run's per-unit times
    (`calibration` is its results file). Episodes run `concurrent_episodes` at a time in both, so
    a unit is a stage's wall time over its episodes; SFT and GRPO training are timed per row; a
    GRPO episode's unit includes the dynamic-sampling refills at the calibration's rate."""
    st = calibration["stages"]
    c, cal = config, CurveConfig(**calibration["config"])
    # the calibration's GRPO episodes: every arm it ran, and the sweep's runs
    grpo = [s for stage in ARMS.values() for s in st.get(stage, {}).get("steps", [])]
    grpo += [s for run in st.get("lr-sweep", {}).get("runs", []) for s in run["steps"]]
    demos = st["demos"]
    demo_pass = demos["summary"]["n_passed"] / demos["summary"]["n_episodes"]
    sft_rows_per_pass = st["sft"]["rows"] / max(1, demos["summary"]["n_passed"])
    grpo_episodes = sum(s["episodes"] for s in grpo)
    evals = st["eval"]
    # an evaluation's episodes: its final checkpoint and its points, sampled and greedy
    eval_units = {name: e["eval_s"] / e["episodes_run"] for name, e in evals.items()}
    train_pass = st["train-pass"]
    units = {
        "demo_episode_s": demos["wall_s"] / demos["summary"]["n_episodes"],
        "demo_pass_rate": demo_pass,
        "sft_rows_per_passing_demo": sft_rows_per_pass,
        "sft_row_s": sft_row_s(st["sft"], cal),
        "calib_episode_s": train_pass["wall_s"] / train_pass["summary"]["n_episodes"],
        "grpo_episode_s": sum(s["rollout_s"] for s in grpo) / grpo_episodes,
        "grpo_row_train_s": sum(s["train_s"] or 0 for s in grpo) / grpo_episodes,
        "eval_episode_s": eval_units,
        "vllm_startup_s": max((e.get("server") or {}).get("startup_s") or 0
                              for e in evals.values()),
    }
    sft_rows = c.n_demo_tasks * demo_pass * sft_rows_per_pass
    arms = len(arm_stages(c))
    per_step = c.grpo_groups_per_step * c.grpo_group_size
    grpo_episodes_full = c.grpo_steps * per_step * arms
    sweep_episodes = len([x for x in c.lr_sweep.split(",") if x.strip()]) * c.lr_sweep_steps \
        * per_step
    points = (c.grpo_steps - 1) // c.grpo_eval_every if c.grpo_eval_every else 0
    per_eval = c.n_heldout * (c.eval_samples + 1)
    per_point = c.n_heldout * ((c.point_samples or c.eval_samples) + 1)
    # A trained policy takes more turns than the base model; its episodes are costed at the
    # slowest checkpoint measured.
    eval_s = max(eval_units.values())
    grpo_unit = units["grpo_episode_s"] + units["grpo_row_train_s"]
    expected = {
        "demos": c.n_demo_tasks * units["demo_episode_s"],
        "sft": sft_rows * c.sft_epochs * units["sft_row_s"],
        "train-pass": c.n_calib_tasks * c.calib_samples * units["calib_episode_s"],
        "lr-sweep": sweep_episodes * grpo_unit,
        "grpo": grpo_episodes_full * grpo_unit,
        "eval-base": per_eval * eval_units.get("base", eval_s),
        "eval-sft": per_eval * eval_s,
        "eval-grpo": (per_eval + points * per_point) * eval_s * arms,  # arms and points
        "vllm-startup": units["vllm_startup_s"],
    }
    expected["total"] = sum(expected.values())
    # The same in CPU seconds (this process, its CLIs and graders, and the vLLM server): on a
    # shared machine wall time is mostly waiting for other users' work; CPU time is not.
    cpu = {name: stage_cpu(st[name], episodes) for name, episodes in (
        ("demos", demos["summary"]["n_episodes"]),
        ("train-pass", train_pass["summary"]["n_episodes"]))}
    cpu["sft_row"] = stage_cpu(st["sft"], st["sft"]["rows"] * cal.sft_epochs)
    arm_stats = [st[a] for a in ARMS.values() if a in st]
    cpu["grpo_episode"] = (sum(stage_cpu(a, 1) for a in arm_stats)
                           / max(1, sum(x["episodes"] for a in arm_stats for x in a["steps"])))
    cpu["eval_episode"] = max(stage_cpu(e, e.get("episodes_total", e["episodes_run"]))
                              for e in evals.values())
    expected_cpu = {
        "demos": c.n_demo_tasks * cpu["demos"],
        "sft": sft_rows * c.sft_epochs * cpu["sft_row"],
        "train-pass": c.n_calib_tasks * c.calib_samples * cpu["train-pass"],
        "lr-sweep": sweep_episodes * cpu["grpo_episode"],
        "grpo": grpo_episodes_full * cpu["grpo_episode"],
        "eval": (per_eval * (2 + arms) + per_point * points * arms) * cpu["eval_episode"],
    }
    expected_cpu["total"] = sum(expected_cpu.values())
    cores = (calibration.get("machine") or {}).get("cores") or 2
    return {"units": units, "cpu_units": cpu, "expected_cpu_s": expected_cpu,
            "expected_wall_s_all_cores": expected_cpu["total"] / cores,
            "sizes": {"demo_tasks": c.n_demo_tasks, "sft_rows_expected": sft_rows,
                      "sft_epochs": c.sft_epochs, "calib_episodes": c.n_calib_tasks
                      * c.calib_samples, "sweep_episodes": sweep_episodes,
                      "grpo_steps": c.grpo_steps, "grpo_episodes": grpo_episodes_full,
                      "arms": arms,
                      "points_per_arm": points, "heldout": c.n_heldout,
                      "eval_episodes_per_checkpoint": per_eval,
                      "eval_episodes_per_point": per_point},
            "expected_s": expected, "budget_s": BUDGET_S,
            "fits": expected["total"] <= BUDGET_S,
            "fits_on_all_cores": expected_cpu["total"] / cores <= BUDGET_S}


def measured_units(calibration: dict[str, Any]) -> dict[str, Any]:
    """The per-unit times an incomplete calibration has: each done stage's wall and CPU
    seconds (its process, children and the vLLM server) per unit."""
    st = calibration["stages"]
    out: dict[str, Any] = {}
    if "demos" in st:
        n = st["demos"]["summary"]["n_episodes"]
        out["demo_episode_s"], out["demo_episode_cpu_s"] = (st["demos"]["wall_s"] / n,
                                                            stage_cpu(st["demos"], n))
    if "sft" in st:
        cal = CurveConfig(**calibration["config"])
        out["sft_row_s"] = sft_row_s(st["sft"], cal)
        out["sft_row_cpu_s"] = stage_cpu(st["sft"], st["sft"]["rows"] * cal.sft_epochs)
        out["sft_row_tokens_mean"] = st["sft"]["row_tokens_mean"]
    if "train-pass" in st:
        n = st["train-pass"]["summary"]["n_episodes"]
        out["calib_episode_s"], out["calib_episode_cpu_s"] = (st["train-pass"]["wall_s"] / n,
                                                              stage_cpu(st["train-pass"], n))
    return out


def stage_cpu(stage: dict[str, Any], units: float) -> float:
    """A stage's CPU seconds (its process, children and the vLLM server) per unit."""
    return (stage["cpu_s"] + stage.get("server_cpu_s", 0.0)) / max(1.0, units)


def sft_row_s(sft: dict[str, Any], config: CurveConfig) -> float:
    """One SFT row's forward+backward (+ its share of the optimizer step): the median step,
    leaving out the first (it also computes the shared system prompt and allocates AdamW's
    state); a resumed stage that timed no step is costed by its wall time."""
    steps = sft["step_s"][1:] or sft["step_s"]
    if steps:
        return median(steps) / config.sft_grad_accum
    return sft["wall_s"] / (sft["rows"] * config.sft_epochs)


def headline_summary(evals: dict[str, Any]) -> dict[str, Any]:
    """The issue's headline figures: per checkpoint pass@1 (with its interval), tool calls on
    solved episodes and quit rate (fractions 0-1); the gated arm's gain over SFT in points with
    a paired bootstrap interval over instances; its tool-call drop on solved episodes, in %.
    A checkpoint not evaluated is None."""
    from harness_gym.training.evaluation import paired_difference

    fields = ("pass_at_1", "pass_at_1_ci", "tool_calls_solved", "quit_rate")
    checkpoints = {name: ({f: evals[stage][f] for f in fields} if stage in evals else None)
                   for stage, name in SUMMARY_NAMES.items()}
    first = next(iter(evals.values()), None)
    out: dict[str, Any] = {
        "heldout_instances": first["n_instances"] if first else 0,
        "samples_per_instance": first["samples_per_instance"] if first else None,
        "checkpoints": checkpoints,
        "grpo_gain_points": None, "grpo_gain_ci": None, "tool_calls_drop_pct": None,
    }
    sft, gated = evals.get("sft"), evals.get("grpo")
    if sft and gated:
        gain = paired_difference(sft["episodes"], gated["episodes"])
        out["grpo_gain_points"], out["grpo_gain_ci"] = gain["points"], gain["ci"]
        if sft["tool_calls_solved"] and gated["tool_calls_solved"] is not None:
            out["tool_calls_drop_pct"] = 100 * (
                1 - gated["tool_calls_solved"] / sft["tool_calls_solved"])
    return out


#: The checkpoint pairs compared by a paired bootstrap over instances (after minus before).
PAIRS = (("base", "sft"), ("sft", "grpo"), ("sft", "grpo-nopenalty"), ("sft", "grpo-flat"),
         ("grpo", "grpo-nopenalty"), ("grpo", "grpo-flat"))


def paired_table(evals: dict[str, Any]) -> dict[str, Any]:
    """pass@1 differences between checkpoints, in points, with paired bootstrap intervals."""
    from harness_gym.training.evaluation import paired_difference

    return {f"{after} - {before}": paired_difference(evals[before]["episodes"],
                                                     evals[after]["episodes"])
            for before, after in PAIRS if before in evals and after in evals}


def targets(evals: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets, as measured (None where a checkpoint is missing)."""
    base, sft, grpo = (evals.get(k) for k in ("base", "sft", "grpo"))
    out: dict[str, Any] = {}
    if base and sft:
        out["sft_pass_at_1"] = sft["pass_at_1"]
        out["sft_reaches_30pct"] = sft["pass_at_1"] >= 0.30
    if sft and grpo:
        out["grpo_gain_points"] = 100 * (grpo["pass_at_1"] - sft["pass_at_1"])
        out["grpo_gains_10_points"] = out["grpo_gain_points"] >= 10
        if sft["tool_calls_solved"] and grpo["tool_calls_solved"] is not None:
            drop = 1 - grpo["tool_calls_solved"] / sft["tool_calls_solved"]
            out["tool_calls_drop"] = drop
            out["tool_calls_drop_20pct_without_pass_loss"] = (
                drop >= 0.20 and grpo["pass_at_1"] >= sft["pass_at_1"])
    flat = evals.get("grpo-flat")
    if grpo and flat:  # the trap: lower pass@1 or more quitting than the gated arm
        from harness_gym.training.evaluation import paired_difference

        gap = paired_difference(grpo["episodes"], flat["episodes"])
        out["flat_minus_gated_points"], out["flat_minus_gated_ci"] = gap["points"], gap["ci"]
        if flat["quit_rate"] is not None and grpo["quit_rate"] is not None:
            out["flat_minus_gated_quit_rate"] = flat["quit_rate"] - grpo["quit_rate"]
        out["flat_shows_the_trap"] = bool(
            (gap["ci"] is not None and gap["ci"][1] < 0)
            or out.get("flat_minus_gated_quit_rate", 0) > 0)
    return out


class PolicyServer:
    """The run's one vLLM CPU server (started at its first use, stopped by `close()`) and the
    weights it holds: a checkpoint's evaluation loads them first (`serving`), a GRPO run pushes
    its trainer's before each step's rollouts (`for_training`, `make_rollout_func`'s
    `weight_sync`)."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.engine: Any = None
        self.sync: Any = None
        self.holds: str | None = None  # the weights' directory, None after a GRPO run
        self.startup_s: float | None = None
        self.load_s: list[float] = []  # each checkpoint's weight load
        self._cpu = 0.0  # the server's CPU seconds at the latest look

    def start(self) -> Any:
        if self.engine is None:
            from harness_gym.engines.vllm_server import load_vllm_serve_engine
            from harness_gym.integrations.weight_transfer import VLLMWeightTransfer

            c, base = self.pipeline.config, self.pipeline.base_dir()
            log(f"vLLM server for {base}: starting")
            wall = time.monotonic()
            self.engine = load_vllm_serve_engine(
                f"{base}?max_model_len={c.vllm_max_model_len}&kv_cache_gib={c.vllm_kv_cache_gib}")
            self.startup_s = time.monotonic() - wall
            self.sync = VLLMWeightTransfer.tmpfs(self.engine)
            self.holds = str(base)
            log(f"vLLM server up in {self.startup_s:.0f} s at {self.engine.urls[0]}")
        return self.engine

    def serving(self, name: str, weights: Path) -> Any:
        """The engine, holding the weights of checkpoint directory `weights`."""
        from safetensors.torch import load_file

        engine = self.start()
        if self.holds != str(weights):
            wall = time.monotonic()
            self.sync.push(load_file(weights / "model.safetensors").items())
            self.holds = str(weights)
            self.load_s.append(time.monotonic() - wall)
            log(f"vLLM server: {name} weights ({weights}) loaded in {self.load_s[-1]:.1f} s")
        return engine

    def for_training(self) -> dict[str, Any]:
        """`make_rollout_func`'s engine and weight sync."""
        return {"engine": self.start(), "weight_sync": self.sync}

    def forget(self) -> None:
        self.holds = None

    def stats(self) -> dict[str, Any]:
        server = getattr(self.engine, "owned_server", None)
        if server is not None:
            self.group = server.group
        return {"startup_s": self.startup_s, "process_group": getattr(self, "group", None),
                "weight_loads": len(self.load_s),
                "weight_load_s_mean": sum(self.load_s) / len(self.load_s) if self.load_s else None}

    def cpu_seconds(self) -> float:
        """CPU time of the server's processes so far (0 before it starts). A stopped server's
        count is kept: later stages start from it, so their difference stays theirs."""
        server = getattr(self.engine, "owned_server", None)
        if server is not None and server.group is not None:
            self._cpu = group_cpu_seconds(server.group)
        return self._cpu

    def close(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            log("vLLM server: stopping")
            try:
                self.sync.destroy()
            finally:
                engine.close()  # stops the server it owns, every process of its group


class PointSaver:
    """A `TrainerCallback` keeping the weights every `every` optimizer steps (before the
    trainer's checkpoint of that step, so a resumed run never lacks a point it passed)."""

    def __new__(cls, directory: Path, every: int, last: int, tokenizer: Any) -> Any:
        import shutil

        from transformers import TrainerCallback

        class _Saver(TrainerCallback):
            def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None,
                            **kw: Any) -> None:
                step = state.global_step
                if step % every or step >= last or model is None:
                    return
                final, tmp = directory / f"step-{step}", directory / f".step-{step}.tmp"
                if final.exists():
                    return
                shutil.rmtree(tmp, ignore_errors=True)
                model.save_pretrained(tmp)
                tokenizer.save_pretrained(tmp)
                tmp.rename(final)  # whole or absent
                log(f"{directory.parent.name}: step {step} kept as a point")

        return _Saver()


def points_of(out: Path) -> list[dict[str, int]]:
    """The points a GRPO run kept (`out/points/step-N`), by step."""
    found = [int(d.name.removeprefix("step-")) for d in (out / "points").glob("step-*")
             if d.is_dir()]
    return [{"step": step} for step in sorted(found)]


def brief(evaluated: dict[str, Any]) -> dict[str, Any]:
    """An evaluation's headline figures (a point along a GRPO run)."""
    fields = ("pass_at_1", "pass_at_1_ci", "tool_calls_solved", "quit_rate", "n_passed",
              "n_scored", "outcomes")
    return {**{f: evaluated[f] for f in fields},
            "greedy_pass_at_1": evaluated["greedy"]["pass_at_1"]}


def task_kind(task: Any) -> str | None:
    """A family task's bug kind (its row's `family.kind`)."""
    family = task.extra.get("family") if isinstance(task.extra, dict) else None
    return family.get("kind") if isinstance(family, dict) else None


def tool_call_counts(episodes: list[dict[str, Any]]) -> dict[str, int]:
    """How many passing episodes made each number of tool calls (the churn SFT inherits)."""
    counts = Counter(e["n_tool_calls"] for e in episodes if e["outcome"] == "passed")
    return {str(k): v for k, v in sorted(counts.items())}


def sweep_score(steps: list[dict[str, Any]]) -> float | None:
    """A sweep run's score: the mean rollout reward of its steps after the first (whose
    rollouts sample the SFT weights whatever the rate); with one step, that step's."""
    later = [s for s in steps if s["step"] > 1] or steps
    return sum(s["reward_mean"] for s in later) / len(later) if later else None


class JournaledRollout:
    """The rollout function, run one GRPO group at a time, each group's rows written to
    `rollouts/step-S-group-G.json` before the trainer sees them, and one record per step
    appended to `steps.jsonl` (outcomes, rewards, times; the trainer's in-memory history does not
    survive a resume).

    A run killed mid-step resumes from the trainer's last checkpoint (saved every step), which
    asks again for the same step's prompts under the same weights: the groups already on disk are
    replayed instead of run again, so a kill loses at most one group's episodes."""

    def __init__(self, rollout: Any, out: Path, group_size: int) -> None:
        self.rollout = rollout
        self.journal = out / "rollouts"
        self.steps = out / "steps.jsonl"
        self.group_size = group_size

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        step = int(trainer.state.global_step) + 1  # the optimizer step these rows feed
        self.journal.mkdir(parents=True, exist_ok=True)
        groups = []
        for g, start in enumerate(range(0, len(prompts), self.group_size)):
            batch = prompts[start:start + self.group_size]
            tasks = [self.rollout.task_for(p).instance_id for p in batch]
            path = self.journal / f"step-{step:05d}-group-{g}.json"
            kept = json.loads(path.read_text()) if path.exists() else None
            if kept is not None and kept["task_ids"] == tasks:
                log(f"{self.steps.parent.name} step {step} group {g}: replayed from {path.name}")
                groups.append(kept)
                continue
            wall, cpu = time.monotonic(), cpu_seconds()
            rows = self.rollout(batch, trainer)
            dynamic = self.rollout.sampling_stats[-1] if self.rollout.dynamic_sampling else None
            kept = {"task_ids": tasks, "rows": rows, "rollout_s": time.monotonic() - wall,
                    "rollout_cpu_s": cpu_seconds() - cpu, "dynamic_sampling": dynamic}
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(kept))
            tmp.replace(path)
            groups.append(kept)
        out = {k: [x for g in groups for x in g["rows"][k]] for k in groups[0]["rows"]}
        self.record(step, out, groups)
        return out

    def record(self, step: int, out: dict[str, list[Any]], groups: list[dict[str, Any]]) -> None:
        rewards, tools = out["reward"], out["n_tool_calls"]
        passed = [t for t, o in zip(tools, out["outcome"], strict=True) if o == "passed"]
        engine = self.rollout.engine
        record = {
            "step": step, "rollout_s": sum(g["rollout_s"] for g in groups),
            "rollout_cpu_s": sum(g["rollout_cpu_s"] for g in groups),
            "episodes": len(rewards), "reward_mean": sum(rewards) / len(rewards),
            "pass_rate": len(passed) / len(rewards), "outcomes": dict(Counter(out["outcome"])),
            "tool_calls_mean": sum(tools) / len(tools),
            "tool_calls_solved_mean": sum(passed) / len(passed) if passed else None,
            "completion_tokens_mean": sum(len(x) for x in out["completion_ids"]) / len(rewards),
            "prefix_cache": engine.prefix_cache_stats if engine is not None else None,
            "policy_versions": sorted(set(out.get("policy_version", []))),
            "dynamic_sampling": dynamic_totals(groups),
        }
        with self.steps.open("a") as f:
            f.write(json.dumps(record) + "\n")
        log(f"{self.steps.parent.name} step {step}: reward {record['reward_mean']:.3f}, "
            f"{record['outcomes']}, rollout {record['rollout_s']:.0f} s, "
            f"dynamic sampling {record['dynamic_sampling']}")

    def read(self) -> list[dict[str, Any]]:
        if not self.steps.exists():
            return []
        records = []
        for line in self.steps.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                continue  # a torn last line of a killed run
        return list({r["step"]: r for r in records}.values())  # a resumed step: the last try


def dynamic_totals(groups: list[dict[str, Any]]) -> dict[str, int] | None:
    """A step's dynamic-sampling counts, summed over its groups (None when it was off)."""
    counts = [g["dynamic_sampling"] for g in groups if g.get("dynamic_sampling")]
    if not counts:
        return None
    return {k: sum(c[k] for c in counts) for k in counts[0] if k != "step"}


class StepTimer:
    """A `TrainerCallback` keeping each optimizer step's wall time."""

    def __new__(cls) -> Any:
        from transformers import TrainerCallback

        class _Timer(TrainerCallback):
            def __init__(self) -> None:
                self.times: list[float] = []
                self.cpu_times: list[float] = []
                self.by_step: dict[int, tuple[float, float]] = {}
                self._started = (0.0, 0.0)

            def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                self._started = (time.monotonic(), cpu_seconds())

            def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                wall = time.monotonic() - self._started[0]
                cpu = cpu_seconds() - self._started[1]
                self.times.append(wall)
                self.cpu_times.append(cpu)
                self.by_step[state.global_step] = (wall, cpu)

        return _Timer()


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


def group_cpu_seconds(group: int) -> float:
    """User + system CPU seconds of every live process of process group `group` (and of the
    children they reaped), from /proc."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group:  # fields: state, ppid, pgrp, ... utime at [11]
            total += sum(int(x) for x in fields[11:15])
    return total / ticks


def cpu_seconds() -> float:
    """CPU time of this process (all its threads) and of its finished children (the CLIs, the
    graders): on a shared machine it tracks the work done far better than wall time."""
    import resource

    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def last_checkpoint(directory: Path) -> str | None:
    from transformers.trainer_utils import get_last_checkpoint

    return get_last_checkpoint(str(directory)) if directory.is_dir() else None


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def parse_overrides(pairs: list[str], config: CurveConfig) -> CurveConfig:
    fields = {f.name: f for f in dataclasses.fields(CurveConfig)}
    changes: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in fields:
            raise SystemExit(f"--set takes KEY=VALUE with KEY one of {', '.join(fields)}")
        current = getattr(config, key)
        changes[key] = (None if value == "none" else
                        type(current)(value) if current is not None else value)
    return dataclasses.replace(config, **changes)


def detach(args: list[str], workdir: Path) -> int:
    """Start this script again with `args` in a new session (it outlives the shell that started
    it), its output appended to `WORKDIR.log`."""
    import subprocess

    log_path = workdir.with_name(workdir.name + ".log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as out:
        child = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), *args, "--no-progress"],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, cwd=REPO)
    print(f"pid {child.pid}, log {log_path}, workdir {workdir}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the quick preset (tiny model)")
    parser.add_argument("--preset", choices=sorted(PRESETS), default=None)
    parser.add_argument("--workdir", type=Path, default=None,
                        help="checkpoints and traces (default ~/.cache/harness-gym/"
                             "learning-curve/PRESET)")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--stages", default=",".join(STAGES),
                        help=f"comma-separated subset of {','.join(STAGES)}")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override one CurveConfig field (recorded in the results)")
    parser.add_argument("--report-only", action="store_true",
                        help="rebuild the results file and plot from --workdir, running nothing")
    parser.add_argument("--readme", action="store_true",
                        help="rewrite README.md's learning-curve block from this run's results")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads for training (default: torch's, all cores); the "
                             "engine's decode thread takes its own (all cores but one)")
    parser.add_argument("--detach", action="store_true",
                        help="run in the background in its own session, output appended to "
                             "WORKDIR.log; prints the process id and the log's path")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    preset = "quick" if args.quick else args.preset or "full"
    workdir = args.workdir or Path.home() / ".cache" / "harness-gym" / "learning-curve" / preset
    if args.detach:
        return detach([a for a in (argv if argv is not None else sys.argv[1:])
                       if a != "--detach"], workdir)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    config = parse_overrides(args.set, PRESETS[preset])
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        parser.error(f"unknown stage {unknown[0]!r}; stages: {', '.join(STAGES)}")
    pipeline = Pipeline(config, workdir, args.results, progress=not args.no_progress)
    # A SIGTERM (`kill PID`) ends the run through its `finally`s: the vLLM server (its own
    # session, so no signal reaches it from the terminal) is stopped, not left behind.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results = pipeline.run([] if args.report_only else stages)
    if args.readme:
        from harness_gym.training.report import readme_block, replace_readme_block

        readme = REPO / "README.md"
        block = readme_block(results, pipeline.results_name + ".json")
        readme.write_text(replace_readme_block(readme.read_text(), block))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
