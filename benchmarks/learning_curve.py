"""The learning curve: a policy trained through the real Pi CLI, from the env's own traces.

    python benchmarks/learning_curve.py --quick            # tiny model, a few minutes
    python benchmarks/learning_curve.py --preset calibrate # SmolLM2, timed slices of each stage
    python benchmarks/learning_curve.py                    # the full run (SmolLM2, <= 3 h)

Stages, each writing its checkpoint and `metrics.json` under `--workdir` and skipped when that
file exists. A run killed at any moment resumes when the same command runs again, losing minutes
at most: demos and evaluations record each episode as it ends and run only the missing tasks
(`run_tasks(resume=True)`), SFT resumes from its trainer checkpoint (every `sft_save_steps`
optimizer steps), GRPO from its checkpoint (every step) with the groups of the step it was cut in
replayed from their journal (`JournaledRollout`). The process id is in `run.pid`.

1. `demos`: the teacher engine (`teacher:<policy>`) solves `family:train` tasks through Pi in the
   env; `RecordTraces` writes every episode (JSON Lines).
2. `sft`: the policy fine-tuned on the passing episodes' agent segments, token for token with
   `loss_mask` as the label mask (`harness_gym.training.sft`, frozen shared prompt prefix).
3. `grpo`, `grpo-nopenalty`, `grpo-flat` (the arms `grpo_arms` names): TRL `GRPOTrainer`
   (`FrozenPrefixGRPOTrainer`) with `make_rollout_func`, each from the SFT checkpoint with the
   same budget: the trainer's own model serves Pi in process; the reward is the env's
   test-gated reward with a tool penalty (`grpo`), without one (`grpo-nopenalty`), or the flat
   penalty that teaches quitting (`grpo-flat`); with `grpo_dynamic_draws` > 0, groups with zero
   reward variance are refilled (dynamic sampling; counts in each step's record).
4. `eval-base`, `eval-sft`, `eval-grpo*`: each checkpoint on `family:heldout` through Pi, one
   episode per instance, greedy decoding: pass@1 (Wilson interval), mean tool calls on solved
   instances (bootstrap interval), quit rate, outcome counts; the results' `summary` holds the
   headline figures (the gated arm's gain over SFT with a paired interval).

Results (every figure and the exact configuration) go to `--results`/learning_curve[_MODE].json,
with the plot beside it as PNG, and the full preset's `plan`: its expected time per stage from
the calibration run's per-unit times. Run the full mode in the background; it logs per stage.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
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
STAGES = ("demos", "sft", *ARMS.values(), "eval-base", "eval-sft",
          *(f"eval-{stage}" for stage in ARMS.values()))
# The results' `summary` names each checkpoint by its arm.
SUMMARY_NAMES = {"base": "base", "sft": "sft", "grpo": "grpo_gated",
                 "grpo-nopenalty": "grpo_nopenalty", "grpo-flat": "grpo_flat"}


@dataclass(frozen=True)
class CurveConfig:
    """Every size, rate and sampling setting of a run (recorded whole in the results)."""

    mode: str
    policy: str  # "tiny", "smollm2" or a model directory
    teacher: str  # the teacher engine spec
    harness: str = "pi"
    sandbox: str | None = None  # None: the env's default (bwrap where it works)
    train_suite: str = "family:train"
    heldout_suite: str = "family:heldout"
    n_demo_tasks: int = 4
    n_heldout: int = 2
    concurrent_episodes: int = 4
    episode_timeout_s: float = 240.0
    max_tokens: int = 24  # per model call of the policy
    demo_max_tokens: int = 1024  # per model call of the teacher (its turns are never cut)
    # SFT
    sft_epochs: float = 1.0
    sft_learning_rate: float = 1e-3
    sft_grad_accum: int = 1
    sft_max_length: int = 8192
    sft_save_steps: int = 5  # optimizer steps between resumable checkpoints
    # GRPO
    grpo_steps: int = 1
    grpo_group_size: int = 4
    grpo_groups_per_step: int = 1
    grpo_learning_rate: float = 1e-4
    grpo_temperature: float = 1.0
    grpo_save_steps: int = 1
    grpo_arms: str = "gated"  # comma-separated, of ARMS
    grpo_dynamic_draws: int = 0  # dynamic sampling: extra groups per zero-variance batch; 0 off
    tool_penalty: float = 0.05
    # evaluation
    eval_temperature: float = 0.0
    seed: int = 0


PRESETS: dict[str, CurveConfig] = {
    # The tiny random model (2 layers): proves every stage runs and computes its metrics.
    "quick": CurveConfig(mode="quick", policy="tiny", teacher="teacher:tiny,score=0",
                         sft_save_steps=2, grpo_arms="gated,nopenalty,flat",
                         grpo_dynamic_draws=1),
    # SmolLM2 with a handful of each unit: the per-unit times that size the full run.
    "calibrate": CurveConfig(
        mode="calibrate", policy="smollm2", teacher="teacher:smollm2,churn=0.6", n_demo_tasks=4,
        n_heldout=2, max_tokens=192, episode_timeout_s=600, sft_learning_rate=5e-5,
        grpo_learning_rate=2e-6, grpo_temperature=0.8, grpo_arms="gated,nopenalty,flat",
        grpo_dynamic_draws=4),
    # The full run, sized from the calibration (its results' `plan`) to fit 3 h of 2 cores: the
    # policy's episodes cost ~40-70 s each (one decode thread, no cross-request batching), an
    # SFT row ~15 s, so held-out instances and GRPO steps are what the budget cuts.
    "full": CurveConfig(
        mode="full", policy="smollm2", teacher="teacher:smollm2,churn=0.6", n_demo_tasks=100,
        n_heldout=20, concurrent_episodes=4, max_tokens=128, episode_timeout_s=420,
        sft_epochs=2, sft_learning_rate=1e-4, sft_grad_accum=4, sft_save_steps=3,
        grpo_steps=4, grpo_group_size=4, grpo_groups_per_step=2, grpo_learning_rate=1e-5,
        grpo_temperature=0.8, tool_penalty=0.05, grpo_arms="gated,nopenalty,flat",
        grpo_dynamic_draws=4),
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
               load: tuple) -> None:
        wall, cpu = started
        metrics = {**metrics, "wall_s": time.monotonic() - wall, "cpu_s": cpu_seconds() - cpu,
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
        for stage in stages:
            if self.done(stage) is not None:
                log(f"{stage}: done earlier, skipped")
                continue
            log(f"{stage}: starting")
            self.stage_dir(stage).mkdir(parents=True, exist_ok=True)
            started, load = (time.monotonic(), cpu_seconds()), os.getloadavg()
            runner = getattr(self, "stage_" + stage.replace("-", "_"))
            self.finish(stage, runner(), started, load)
            log(f"{stage}: done in {time.monotonic() - started[0]:.0f} s "
                f"({cpu_seconds() - started[1]:.0f} CPU s)")
        return self.write_results()

    # --- models -------------------------------------------------------------------------------

    def base_dir(self) -> Path:
        if self.config.policy == "tiny":
            from harness_gym.engines.tiny import tiny_model_dir

            return tiny_model_dir()
        if self.config.policy == "smollm2":
            from harness_gym.engines.smollm2 import smollm2_model_dir

            return smollm2_model_dir()
        return Path(self.config.policy)

    def checkpoint(self, name: str) -> Path:
        return self.base_dir() if name == "base" else self.stage_dir(name) / "model"

    def episode_config(self, engine: Any, temperature: float, max_tokens: int) -> Any:
        from harness_gym.config import EpisodeConfig

        c = self.config
        return EpisodeConfig(
            harness=c.harness, engine=engine, sandbox=c.sandbox,
            reward={"tool_penalty": c.tool_penalty}, episode_timeout_s=c.episode_timeout_s,
            sampling={"temperature": temperature, "max_tokens": max_tokens, "seed": c.seed},
            progress=False)

    def tasks(self, suite: str, n: int) -> list[Any]:
        from harness_gym.tasks import load_tasks

        return load_tasks(suite)[:n]

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

    def stage_grpo(self) -> dict[str, Any]:
        return self.train_arm("grpo")

    def stage_grpo_nopenalty(self) -> dict[str, Any]:
        return self.train_arm("grpo-nopenalty")

    def stage_grpo_flat(self) -> dict[str, Any]:
        return self.train_arm("grpo-flat")

    def train_arm(self, stage: str) -> dict[str, Any]:
        """One GRPO arm from the SFT checkpoint, its reward per `arm_reward`."""
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from trl import GRPOConfig

        from harness_gym.integrations.trl import harness_reward, make_rollout_func, task_dataset
        from harness_gym.training.trainers import FrozenPrefixGRPOTrainer

        c = self.config
        start = self.checkpoint("sft")
        out = self.stage_dir(stage)
        model = AutoModelForCausalLM.from_pretrained(start, dtype="float32")
        tokenizer = AutoTokenizer.from_pretrained(start)
        train_tasks = self.tasks(c.train_suite, 10**9)
        rollout = make_rollout_func(
            harness=c.harness, tasks=train_tasks, max_tokens=c.max_tokens, sandbox=c.sandbox,
            reward=arm_reward(stage, c.tool_penalty), episode_timeout_s=c.episode_timeout_s,
            dynamic_sampling=c.grpo_dynamic_draws or None)
        logged = JournaledRollout(rollout, out, c.grpo_group_size)
        args = GRPOConfig(
            output_dir=str(out / "trainer"), per_device_train_batch_size=c.grpo_group_size,
            num_generations=c.grpo_group_size, gradient_accumulation_steps=c.grpo_groups_per_step,
            max_steps=c.grpo_steps, learning_rate=c.grpo_learning_rate,
            lr_scheduler_type="constant", temperature=c.grpo_temperature, beta=0.0,
            max_completion_length=c.max_tokens, logging_steps=1, save_strategy="steps",
            save_steps=c.grpo_save_steps, save_total_limit=1, report_to="none", use_cpu=True,
            bf16=False, activation_checkpointing=False, seed=c.seed)
        timer = StepTimer()
        trainer = FrozenPrefixGRPOTrainer(
            model=model, processing_class=tokenizer, args=args,
            train_dataset=task_dataset(train_tasks), reward_funcs=harness_reward,
            rollout_func=logged, callbacks=[timer])
        try:
            trainer.train(resume_from_checkpoint=last_checkpoint(out / "trainer"))
        finally:
            rollout.close()
        trainer.save_model(out / "model")
        tokenizer.save_pretrained(out / "model")
        steps = logged.read()
        for record in steps:  # a step's time beyond its rollout was the optimisation
            wall, cpu = timer.by_step.get(record["step"], (None, None))
            record["train_s"] = None if wall is None else max(0.0, wall - record["rollout_s"])
            record["train_cpu_s"] = None if cpu is None else max(0.0, cpu - record["rollout_cpu_s"])
        return {"steps": steps, "optimizer_steps": trainer.state.global_step,
                "reward": arm_reward(stage, c.tool_penalty),
                "log_history": trainer.state.log_history, **trainer.frozen_prefix_stats()}

    def evaluate(self, name: str) -> dict[str, Any]:
        from harness_gym.engines import TransformersEngine
        from harness_gym.training.evaluation import run_tasks, summarize

        c = self.config
        engine = TransformersEngine.from_pretrained(self.checkpoint(name), model_name="policy")
        try:
            episodes = run_tasks(
                self.tasks(c.heldout_suite, c.n_heldout),
                self.episode_config(engine, c.eval_temperature, c.max_tokens),
                out_dir=self.stage_dir(f"eval-{name}") / "traces",
                num_envs=c.concurrent_episodes, progress=self.progress, resume=True)
            cache = engine.prefix_cache_stats
        finally:
            engine.close()
        return {"summary": summarize(episodes), "episodes": episodes, "prefix_cache": cache,
                "sampling": {"temperature": c.eval_temperature, "max_tokens": c.max_tokens,
                             "episodes_per_instance": 1}}

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
        except (KeyError, ZeroDivisionError):
            return None  # the calibration is not complete yet

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
        results["summary"] = headline_summary(stages["eval"])
        results["targets"] = targets(stages["eval"])
        results["plan"] = self.plan(results)
        self.results_dir.mkdir(parents=True, exist_ok=True)
        name = self.results_name
        (self.results_dir / f"{name}.json").write_text(json.dumps(results, indent=1))
        if stages["eval"]:
            plot_learning_curve(results, self.results_dir / f"{name}.png")
            log("\n" + results_table(results))
        return results


def plan(config: CurveConfig, calibration: dict[str, Any]) -> dict[str, Any]:
    """The full run's expected wall time per stage, from a calibrate run's per-unit times
    (`calibration` is its results file). Episodes run `concurrent_episodes` at a time in both, so
    a unit is a stage's wall time over its episodes; SFT and GRPO training are timed per row."""
    st = calibration["stages"]
    c, cal = config, CurveConfig(**calibration["config"])
    # the calibration's GRPO episodes: every arm it ran
    grpo = [s for stage in ARMS.values() for s in st.get(stage, {}).get("steps", [])]
    demos = st["demos"]
    demo_pass = demos["summary"]["n_passed"] / demos["summary"]["n_episodes"]
    sft_rows_per_pass = st["sft"]["rows"] / max(1, demos["summary"]["n_passed"])
    grpo_episodes = sum(s["episodes"] for s in grpo)
    units = {
        "demo_episode_s": demos["wall_s"] / demos["summary"]["n_episodes"],
        "demo_pass_rate": demo_pass,
        "sft_rows_per_passing_demo": sft_rows_per_pass,
        "sft_row_s": sft_row_s(st["sft"], cal),
        "grpo_episode_s": sum(s["rollout_s"] for s in grpo) / grpo_episodes,
        "grpo_row_train_s": sum(s["train_s"] or 0 for s in grpo) / grpo_episodes,
        "eval_episode_s": {name: e["wall_s"] / e["n_episodes"]
                           for name, e in st["eval"].items()},
    }
    sft_rows = c.n_demo_tasks * demo_pass * sft_rows_per_pass
    arms = len(arm_stages(c))
    grpo_episodes_full = c.grpo_steps * c.grpo_groups_per_step * c.grpo_group_size * arms
    # A trained policy takes more turns than the base model; its episodes are costed at the
    # slowest checkpoint measured, and the worst case at the episode timeout.
    eval_s = max(units["eval_episode_s"].values())
    expected = {
        "demos": c.n_demo_tasks * units["demo_episode_s"],
        "sft": sft_rows * c.sft_epochs * units["sft_row_s"],
        "grpo": grpo_episodes_full * (units["grpo_episode_s"] + units["grpo_row_train_s"]),
        "eval-base": c.n_heldout * units["eval_episode_s"].get("base", eval_s),
        "eval-sft": c.n_heldout * eval_s,
        "eval-grpo": c.n_heldout * eval_s * arms,  # every arm's evaluation
    }
    expected["total"] = sum(expected.values())
    return {"units": units,
            "sizes": {"demo_tasks": c.n_demo_tasks, "sft_rows_expected": sft_rows,
                      "sft_epochs": c.sft_epochs, "grpo_steps": c.grpo_steps,
                      "grpo_episodes": grpo_episodes_full, "heldout": c.n_heldout},
            "expected_s": expected, "budget_s": 3 * 3600}


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
    return out


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
    import harness_gym.integrations.trl
    import harness_gym.training.sft
    import harness_gym.training.evaluation
    import harness_gym.training.report
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
    results = pipeline.run([] if args.report_only else stages)
    if args.readme:
        from harness_gym.training.report import readme_block, replace_readme_block

        readme = REPO / "README.md"
        block = readme_block(results, pipeline.results_name + ".json")
        readme.write_text(replace_readme_block(readme.read_text(), block))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
