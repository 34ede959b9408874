"""The learning curve: a policy trained through the real Pi CLI, from the env's own traces.

    python benchmarks/learning_curve.py --quick            # tiny-vllm on a real vLLM server
    python benchmarks/learning_curve.py --preset calibrate # SmolLM2, timed slices of each stage
    python benchmarks/learning_curve.py --preset full      # the full run (SmolLM2, see `plan`)

The full run is started in the background, and resumed by running the very same command again
(a workdir or state whose recorded configuration differs is taken up only where the change
touches no stage it has begun; `--redo-changed` runs those stages again, keeping the earlier
ones: `curve.config.FIELD_STAGE` says which stage each field changes first):

    cd /work/wt/learn && nohup nice -n 10 ./.venv/bin/python benchmarks/learning_curve.py \
        --preset full --workdir ~/.cache/harness-gym/learning-curve/full --no-progress \
        --state benchmarks/results/learning_curve_state/full >> /tmp/learning_full.log 2>&1 &

Every working session gets a fresh machine, where only what is committed survives: the run's
state travels in git. With `--state benchmarks/results/learning_curve_state/full` each finished
stage and each trainer checkpoint is saved into that folder (LoRA adapters with their optimizer
state, traces gzip-compressed; `curve/state.py`; a run's trainer checkpoint is dropped once the
run ends, `Pipeline.drop_trainer`), and a new machine's empty workdir is filled from it before
the run resumes: commit the folder before the session ends.

The committed calibration (`learning_curve_calibrate.json`) was cut at the session's end; it is
completed (and its `plan` filled in) by resuming it alike:

    ./.venv/bin/python benchmarks/learning_curve.py --preset calibrate \
        --workdir ~/.cache/harness-gym/learning-curve/calibrate-v4 --no-progress

Stages, each writing its checkpoint and `metrics.json` under `--workdir` and skipped when that
file exists. A run killed at any moment resumes when the same command runs again, losing minutes
at most: demos and evaluations record each episode as it ends and run only the missing ones
(`run_tasks(resume=True)`), SFT resumes from its trainer checkpoint (every `sft_save_steps`
optimizer steps), GRPO from its checkpoint (every step) with the groups of the step it was cut in
replayed from their journal (`JournaledRollout`). The process id is in `run.pid`, which the run
locks: a second run on a live workdir is refused (`--report-only` reads one). A stage's
wall and CPU time count every sitting it ran in: a cut one records its time in the stage's
`sittings.json` (`curve.state.record_sitting`), and its metrics add them up when it ends.

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
   With `sft_val_fraction` > 0 that share of the demonstrations (whole episodes) is held out,
   its loss measured at every checkpoint, and the stage keeps the checkpoint of the lowest
   (early stopping after `sft_patience` checkpoints without a new lowest): train and held-out
   losses per checkpoint and the step kept are in its metrics' `validation`.
   With `lora_rank` > 0 (every preset) it trains a LoRA adapter, which GRPO goes on training;
   the server always gets merged full weights (`harness_gym.training.lora`), and a checkpoint's
   adapter is merged into `WORKDIR/.merged/` when an evaluation needs it.
3. `train-pass`: the calibration of the tier: the SFT policy at the rollout sampling (the
   temperature `grpo_temperature` within the nucleus `grpo_top_p`/`grpo_top_k`, which GRPO's
   rollouts and the evaluation's samples use too) on
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
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from curve.config import (
    ARMS,
    PRESETS,
    STAGES,
    ZONE,
    CurveConfig,
    parse_overrides,
    recorded_differences,
    wanted,
)
from curve.evaluation import EvaluationStages
from curve.grpo import GrpoStages
from curve.journal import StepTimer, train_resumed
from curve.policy_server import PolicyServer
from curve.process import claim_workdir, cpu_seconds, log, preload, torch_threads
from curve.results import ResultsWriter
from curve.state import RunState, earlier_sittings, reconcile, record_sitting
from curve.summary import tool_call_counts

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"


class Pipeline(GrpoStages, EvaluationStages, ResultsWriter):
    """The run: its stages in order, each resumable, each recorded in the workdir (and the
    state); the GRPO, evaluation and results parts live in `curve.grpo`, `curve.evaluation` and
    `curve.results`."""

    def __init__(self, config: CurveConfig, workdir: Path, results_dir: Path, *,
                 progress: bool = True, state: Path | None = None,
                 redo_changed: bool = False, keep_checkpoints: bool = False) -> None:
        self.config = config
        self.keep_checkpoints = keep_checkpoints
        self.redo_changed = redo_changed
        self.workdir = workdir
        self.results_dir = results_dir
        self.progress = progress
        self.state = RunState(state, workdir) if state is not None else None
        if self.state is not None and config.lora_rank < 1:
            raise SystemExit("--state keeps a run in git: its checkpoints must be LoRA "
                             "adapters (set lora_rank; full weights are 540 MB for SmolLM2)")

    # --- resume bookkeeping -----------------------------------------------------------------

    def check_workdir(self) -> None:
        """Take up the run recorded in the workdir, under this configuration where it changes
        no stage the run has begun (`curve.state.reconcile`; `--redo-changed` runs those
        again); a new workdir records it."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        mine = dataclasses.asdict(self.config)
        if recorded_differences(self.workdir, mine) is None:
            (self.workdir / "config.json").write_text(json.dumps(mine, indent=2))
        reconcile(self.workdir, mine, redo_changed=self.redo_changed)

    def stage_dir(self, stage: str) -> Path:
        return self.workdir / stage

    def done(self, stage: str) -> dict[str, Any] | None:
        path = self.stage_dir(stage) / "metrics.json"
        return json.loads(path.read_text()) if path.exists() else None

    def drop_trainer(self, run_dir: Path) -> None:
        """Remove a finished run's trainer checkpoint (an adapter with its optimizer state, 30 MB
        for SmolLM2's rank-8 adapter): nothing resumes it, and the state would carry it in git
        (`--keep-checkpoints` keeps it, e.g. to train it on)."""
        if not self.keep_checkpoints:
            shutil.rmtree(run_dir / "trainer", ignore_errors=True)

    def spent(self, started: tuple[float, float], server_cpu: float) -> dict[str, float]:
        """This sitting's time on a stage begun at `started` (wall, CPU): cpu_s counts this
        process and its finished children (CLIs, graders); server_cpu_s the vLLM server's
        processes (no finished child until the run ends)."""
        return {"wall_s": time.monotonic() - started[0], "cpu_s": cpu_seconds() - started[1],
                "server_cpu_s": self.server.cpu_seconds() - server_cpu}

    def finish(self, stage: str, metrics: dict[str, Any], started: tuple[float, float],
               load: tuple, server_cpu: float) -> None:
        # a stage resumed across sittings: its time is theirs and this one's
        sittings = [*earlier_sittings(self.stage_dir(stage)), self.spent(started, server_cpu)]
        # a sitting recorded by hand may lack CPU figures (None): the sums are then lower bounds
        totals = {key: sum(s[key] or 0.0 for s in sittings)
                  for key in ("wall_s", "cpu_s", "server_cpu_s")}
        metrics = {**metrics, **totals, "sittings": len(sittings),
                   "cpu_s_partial": any(s["cpu_s"] is None for s in sittings),
                   "threads": torch_threads(), "load_avg_start": list(load),
                   "load_avg_end": list(os.getloadavg())}
        path = self.stage_dir(stage) / "metrics.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(metrics, indent=2))
        tmp.replace(path)  # atomic: a half-written file never marks a stage done
        self.drop_trainer(self.stage_dir(stage))  # its weights are in model/, figures above
        if self.state is not None:
            self.state.save()

    def run(self, stages: list[str]) -> dict[str, Any]:
        """Run `stages` (those not done yet) and write the results; with none, only report
        (reading the workdir, which a live run may hold)."""
        if not stages:
            return self._report()
        with claim_workdir(self.workdir):
            return self._run(stages)

    def _report(self) -> dict[str, Any]:
        if self.state is not None:
            self.state.restore()
        if not (self.workdir / "config.json").exists():
            raise SystemExit(f"{self.workdir} holds no run to report on")
        return self.write_results()

    def _run(self, stages: list[str]) -> dict[str, Any]:
        if self.state is not None:  # a fresh machine: the workdir from the committed state
            self.state.check(dataclasses.asdict(self.config), redo_changed=self.redo_changed)
            self.state.restore()
        self.check_workdir()
        stages = wanted(stages, self.config)
        if any(self.done(stage) is None for stage in stages):
            preload()
        for stage in STAGES:  # a state saved before finished runs' checkpoints were dropped
            if self.done(stage) is not None:
                for run_dir in [self.stage_dir(stage), *self.stage_dir(stage).glob("lr-*")]:
                    self.drop_trainer(run_dir)
        try:
            for stage in stages:
                if self.done(stage) is not None:
                    log(f"{stage}: done earlier, skipped")
                    continue
                log(f"{stage}: starting")
                self.stage_dir(stage).mkdir(parents=True, exist_ok=True)
                started, load = (time.monotonic(), cpu_seconds()), os.getloadavg()
                server_cpu = self.server.cpu_seconds()
                runner = self.runner(stage)
                try:
                    metrics = runner()
                except BaseException:  # cut (a signal, the session's end) or failed
                    record_sitting(self.stage_dir(stage), **self.spent(started, server_cpu))
                    raise
                self.finish(stage, metrics, started, load, server_cpu)
                log(f"{stage}: done in {time.monotonic() - started[0]:.0f} s "
                    f"({cpu_seconds() - started[1]:.0f} CPU s)")
        finally:
            self.server.close()  # the run's vLLM server: stopped however the run ends
            if self.state is not None:  # what a cut stage has recorded so far, too
                self.state.save()
        return self.write_results()

    def runner(self, stage: str) -> Callable[[], dict[str, Any]]:
        """The stage's work: an arm trains (`train_arm`), `eval-NAME` evaluates checkpoint NAME
        (`evaluate`), any other stage is the method `stage_NAME`."""
        if stage in ARMS.values():
            return lambda: self.train_arm(stage)
        if stage.startswith("eval-"):
            return lambda: self.evaluate(stage.removeprefix("eval-"))
        return getattr(self, "stage_" + stage.replace("-", "_"))

    # --- models -------------------------------------------------------------------------------

    def base_dir(self) -> Path:
        if self.config.policy == "tiny":
            from harness_gym.engines.tiny import tiny_model_dir

            return tiny_model_dir()
        from harness_gym.engines.vllm_server import resolve_model_dir

        return resolve_model_dir(self.config.policy)  # tiny-vllm, smollm2 or a directory

    def checkpoint(self, name: str) -> Path:
        """Checkpoint `name`'s full weights (a model directory)."""
        return self.base_dir() if name == "base" else self.weights(self.stage_dir(name) / "model")

    def weights(self, saved: Path) -> Path:
        """A saved checkpoint as full weights: a LoRA adapter is merged once into the workdir's
        `.merged/` (local: never in the state, made again from the adapter when needed)."""
        from harness_gym.training.lora import is_adapter_dir, materialise

        if not is_adapter_dir(saved):
            return saved
        return materialise(saved, self.base_dir(),
                           self.workdir / ".merged" / saved.relative_to(self.workdir))

    def lora(self) -> Any:
        """The run's `LoraSpec`, None for full fine-tuning."""
        from harness_gym.training.lora import LoraSpec

        c = self.config
        if c.lora_rank < 1:
            return None
        targets = tuple(t.strip() for t in c.lora_targets.split(",") if t.strip())
        return LoraSpec(rank=c.lora_rank, alpha=c.lora_alpha or None, targets=targets)

    def state_callbacks(self) -> list[Any]:
        return [self.state.callback()] if self.state is not None else []

    def episode_config(self, engine: Any, temperature: float, max_tokens: int, *,
                       seeded: bool = True, policy: bool = True) -> Any:
        """Episodes of `engine`; `seeded=False` for several samples of one instance (a seed
        would make a server's samples of the same prompt identical); `policy=False` for the
        teacher's, which `max_model_calls` does not cap."""
        from harness_gym.config import EpisodeConfig

        c = self.config
        sampling = {"temperature": temperature, "max_tokens": max_tokens}
        if temperature > 0:  # every sampled episode here samples as the rollouts do
            sampling.update(top_p=c.grpo_top_p, top_k=c.grpo_top_k)
        if seeded:
            sampling["seed"] = c.seed
        return EpisodeConfig(
            harness=c.harness, engine=engine, sandbox=c.sandbox,
            reward={"tool_penalty": c.tool_penalty}, episode_timeout_s=c.episode_timeout_s,
            max_model_calls=(c.max_model_calls or None) if policy else None,
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
                self.episode_config(teacher, 0.0, c.demo_max_tokens, policy=False),
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

        from harness_gym.training.sft import (
            sft_rows,
            sft_trainer,
            turn_opening_nll,
            validation_split,
        )

        c = self.config
        rows = sft_rows(self.stage_dir("demos") / "traces", max_length=c.sft_max_length)
        if not rows:
            raise SystemExit("no passing demonstration to train on: see demos/metrics.json")
        train, held_out = (validation_split(rows, c.sft_val_fraction, seed=c.seed)
                           if c.sft_val_fraction else (rows, None))
        base = self.base_dir()
        model = AutoModelForCausalLM.from_pretrained(base, dtype="float32")
        tokenizer = AutoTokenizer.from_pretrained(base)
        out = self.stage_dir("sft")
        timer = StepTimer()
        trainer = sft_trainer(
            model, tokenizer, train, output_dir=out / "trainer", frozen_prefix=True,
            num_train_epochs=c.sft_epochs, learning_rate=c.sft_learning_rate,
            gradient_accumulation_steps=c.sft_grad_accum, seed=c.seed,
            save_strategy="steps", save_steps=c.sft_save_steps, save_total_limit=1,
            lora=self.lora(), eval_rows=held_out, patience=c.sft_patience)
        for callback in [timer, *self.state_callbacks()]:
            trainer.add_callback(callback)
        train_resumed(trainer, out / "trainer")
        trainer.save_model(out / "model")  # with held-out rows: the best checkpoint's weights
        tokenizer.save_pretrained(out / "model")
        history = trainer.state.log_history
        losses = [e["loss"] for e in history if "loss" in e]
        lengths = [len(r["input_ids"]) for r in train]
        return {
            "rows": len(train), "row_tokens_mean": sum(lengths) / len(lengths),
            "loss_tokens": sum(sum(x != -100 for x in r["labels"]) for r in train),
            "optimizer_steps": trainer.state.global_step, "losses": losses,
            **validation_record(history, trainer.state, held_out),
            # each turn's first token (its decision) apart from the mean: `turn_opening_nll`
            "validation_turn_openings": (turn_opening_nll(trainer.model, held_out)
                                         if held_out else None),
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
                "temperature": c.grpo_temperature, "top_p": c.grpo_top_p,
                "top_k": c.grpo_top_k, "samples_per_instance": c.calib_samples}


def validation_record(history: list[dict[str, Any]], state: Any,
                      held_out: list[dict[str, Any]] | None) -> dict[str, Any]:
    """SFT's validation, from the trainer's log: at each checkpoint the held-out loss and the
    mean training loss since the one before; the checkpoint kept (the lowest held-out loss)."""
    if held_out is None:
        return {"validation": None}
    evaluations, since = [], []
    for entry in history:
        if "loss" in entry:
            since.append(entry["loss"])
        if "eval_loss" in entry:
            evaluations.append({"step": entry["step"], "val_loss": entry["eval_loss"],
                                "train_loss": sum(since) / len(since) if since else None})
            since = []
    best = state.best_model_checkpoint
    return {"validation": {
        "rows": len(held_out), "tasks": sorted({str(r["task_id"]) for r in held_out}),
        "evaluations": evaluations, "best_val_loss": state.best_metric,
        "best_step": int(Path(best).name.removeprefix("checkpoint-")) if best else None,
        "stopped_early": state.global_step < state.max_steps}}


def task_kind(task: Any) -> str | None:
    """A family task's bug kind (its row's `family.kind`)."""
    family = task.extra.get("family") if isinstance(task.extra, dict) else None
    return family.get("kind") if isinstance(family, dict) else None


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
    parser.add_argument("--state", type=Path, default=None,
                        help="a folder to commit (e.g. benchmarks/results/learning_curve_state/"
                             "PRESET): each finished stage and trainer checkpoint is saved "
                             "into it, and an empty workdir resumes from it (LoRA runs only)")
    parser.add_argument("--redo-changed", action="store_true",
                        help="where --set or a changed preset differs from the configuration "
                             "the workdir/state recorded, run again the stages it changes "
                             "(from the first, e.g. sft on) and keep the earlier ones")
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
    parser.add_argument("--keep-checkpoints", action="store_true",
                        help="keep each finished run's trainer checkpoint (SFT's, each arm's, "
                             "each swept rate's: an adapter with its optimizer state); by "
                             "default dropped when the run ends, since nothing resumes it")
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
    pipeline = Pipeline(config, workdir, args.results, progress=not args.no_progress,
                        state=args.state, redo_changed=args.redo_changed,
                        keep_checkpoints=args.keep_checkpoints)
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
