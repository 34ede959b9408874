"""What a GRPO run keeps as it goes: its rollouts' journal, step times and points."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from .process import cpu_seconds, log


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


def last_checkpoint(directory: Path) -> str | None:
    from transformers.trainer_utils import get_last_checkpoint

    return get_last_checkpoint(str(directory)) if directory.is_dir() else None


def train_resumed(trainer: Any, directory: Path) -> None:
    """`trainer.train()`, resumed from its last checkpoint in `directory` if there is one. A
    checkpoint at the run's last step (or where early stopping ended it) is taken as it is,
    not resumed: transformers 5 checks
    `max_steps` only after a step, so resuming it would run one step more (for GRPO, one more
    group of episodes, on a run cut between its last checkpoint and its metrics).

    A trainer that keeps its best checkpoint (`load_best_model_at_end`) ends with its weights
    either way. Its state names that checkpoint by the path it was saved under, which a run
    restored into another workdir (`--state`) does not have: the name is looked up in
    `directory`, so the best is neither lost to the rotation of checkpoints nor left unloaded."""
    from transformers import TrainerCallback, TrainerState

    def relocate(state: Any) -> None:
        if state.best_model_checkpoint:
            state.best_model_checkpoint = str(directory / Path(state.best_model_checkpoint).name)

    class _Relocate(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            relocate(state)  # the state a resumed run has just loaded from its checkpoint

    resume = last_checkpoint(directory)
    if resume is not None:
        saved = TrainerState.load_from_json(str(Path(resume) / "trainer_state.json"))
        control = (saved.stateful_callbacks or {}).get("TrainerControl", {}).get("args", {})
        if saved.max_steps and saved.global_step >= saved.max_steps \
                or control.get("should_training_stop"):  # early stopping ended it there
            trainer._load_from_checkpoint(resume)  # its weights (an adapter: into the peft model)
            trainer.state = saved
            relocate(saved)
            if trainer.args.load_best_model_at_end and saved.best_model_checkpoint:
                trainer._load_best_model()
            log(f"{directory.parent.name}: its checkpoint at step {saved.global_step} is its "
                "last: taken as it is")
            return
    trainer.add_callback(_Relocate())
    trainer.train(resume_from_checkpoint=resume)
