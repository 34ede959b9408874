"""The learning curve's state folder (benchmarks/curve/state.py), without the pipeline: what it
keeps and leaves out, that it round-trips byte for byte into an empty workdir (a fresh machine's
cache), writes nothing for an unchanged workdir, drops what the workdir dropped, refuses another
run's folder and a file too large for git; and that a LoRA SFT run cut after a checkpoint,
restored from the folder into a fresh workdir, ends with the adapter of an uncut run."""

from __future__ import annotations

import gzip
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("peft")

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
from curve import state as state_module  # noqa: E402
from curve.journal import last_checkpoint, train_resumed  # noqa: E402
from curve.state import (  # noqa: E402
    RunState,
    StateError,
    discarded,
    earlier_sittings,
    reconcile,
    record_sitting,
)

CONFIG = {"mode": "quick", "lora_rank": 4}


def files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


def write(root: Path, rel: str, data: bytes | str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)


def a_workdir(root: Path) -> Path:
    """A workdir as a run leaves it: kept files, and the local ones the state leaves out."""
    work = root / "work"
    write(work, "config.json", json.dumps(CONFIG))
    write(work, "demos/metrics.json", '{"n": 2}')
    write(work, "demos/traces/teacher.jsonl", '{"trace": [1, 2, 3]}\n' * 50)
    ckpt = "sft/trainer/checkpoint-2/"
    write(work, ckpt + "adapter_model.safetensors", bytes(range(256)) * 8)
    write(work, ckpt + "optimizer.pt", b"\x80\x02optimizer" * 30)
    write(work, ckpt + "trainer_state.json", '{"global_step": 2}')
    for local in (ckpt + "tokenizer.json", ckpt + "README.md", "run.pid",
                  ".merged/sft/model/model.safetensors",
                  "demos/.metrics.json.tmp", "sft/tmp-abc/x"):
        write(work, local, b"local")
    return work


def test_the_state_keeps_the_run_compressed_and_leaves_local_files_out(tmp_path):
    work = a_workdir(tmp_path)
    stats = RunState(tmp_path / "state", work).save()
    kept = files(tmp_path / "state")
    assert sorted(kept) == sorted(stats.written) == [
        "config.json", "demos/metrics.json", "demos/traces/teacher.jsonl.gz",
        "sft/trainer/checkpoint-2/adapter_model.safetensors",
        "sft/trainer/checkpoint-2/optimizer.pt",
        "sft/trainer/checkpoint-2/trainer_state.json.gz"]
    trace = (work / "demos/traces/teacher.jsonl").read_bytes()
    assert gzip.decompress(kept["demos/traces/teacher.jsonl.gz"]) == trace
    assert len(kept["demos/traces/teacher.jsonl.gz"]) < len(trace) / 5
    assert stats.bytes == sum(map(len, kept.values()))
    assert RunState(tmp_path / "state", work).bytes_by_stage() == {
        "config.json": len(kept["config.json"]),
        "demos": sum(len(b) for n, b in kept.items() if n.startswith("demos/")),
        "sft": sum(len(b) for n, b in kept.items() if n.startswith("sft/"))}


def test_an_empty_workdir_gets_the_run_back_byte_for_byte_and_a_resave_writes_nothing(tmp_path):
    work = a_workdir(tmp_path)
    RunState(tmp_path / "state", work).save()
    stored = files(tmp_path / "state")
    fresh = tmp_path / "fresh-cache" / "learning-curve" / "quick"
    restored = RunState(tmp_path / "state", fresh)
    restored.check(CONFIG)
    assert restored.restore() == len(stored)
    original = files(work)
    assert files(fresh) == {n: original[n] for n in (
        "config.json", "demos/metrics.json", "demos/traces/teacher.jsonl",
        "sft/trainer/checkpoint-2/adapter_model.safetensors",
        "sft/trainer/checkpoint-2/optimizer.pt", "sft/trainer/checkpoint-2/trainer_state.json")}
    assert restored.restore() == 0  # what the workdir has is its own
    again = restored.save()
    assert again.written == again.removed == [] and files(tmp_path / "state") == stored


def test_the_state_follows_the_workdir_a_rotated_checkpoint_leaves_it(tmp_path):
    work = a_workdir(tmp_path)
    state = RunState(tmp_path / "state", work)
    state.save()
    (work / "sft/trainer/checkpoint-2").rename(work / "sft/trainer/checkpoint-4")
    stats = state.save()
    assert sorted(stats.removed) == [f"sft/trainer/checkpoint-2/{n}" for n in (
        "adapter_model.safetensors", "optimizer.pt", "trainer_state.json.gz")]
    assert not (tmp_path / "state/sft/trainer/checkpoint-2").exists()  # no empty folder left
    assert (tmp_path / "state/sft/trainer/checkpoint-4/optimizer.pt").is_file()


def test_another_runs_folder_and_a_full_weight_file_are_refused(tmp_path, monkeypatch):
    work = a_workdir(tmp_path)
    RunState(tmp_path / "state", work).save()
    with pytest.raises(StateError, match="lora_rank"):
        RunState(tmp_path / "state", work).check({**CONFIG, "lora_rank": 8})
    write(tmp_path, "other/notes.txt", "mine")
    with pytest.raises(StateError, match="no config.json"):
        RunState(tmp_path / "other", work).check(CONFIG)
    monkeypatch.setattr(state_module, "MAX_FILE_BYTES", 1024)
    write(work, "sft/model/model.safetensors", b"w" * 2048)
    with pytest.raises(StateError, match="too large"):
        RunState(tmp_path / "state", work).save()
    assert not (tmp_path / "state/sft/model/model.safetensors").exists()


# --- a LoRA trainer checkpoint through the state ----------------------------------------------


class StopAt:
    """Ends training after global step `step` (its checkpoint saved): a kill after it."""

    def __init__(self, step: int) -> None:
        self.step = step

    def callback(self) -> Any:
        from transformers import TrainerCallback

        stop = self.step

        class _Stop(TrainerCallback):
            def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
                if state.global_step >= stop:
                    control.should_training_stop = True
                return control

        return _Stop()


def sft(work: Path, callbacks: list[Any] = (), *, max_steps: int = 4, save_steps: int = 2,
        patience: int = 0) -> Any:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from harness_gym.engines.tiny import tiny_model_dir
    from harness_gym.training.lora import LoraSpec
    from harness_gym.training.sft import sft_trainer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir())
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir(), dtype="float32")
    prompt = tokenizer("Fix the bug in add():\n")["input_ids"]
    answer = tokenizer("def add(a, b):\n    return a + b\n")["input_ids"]
    rows = [{"input_ids": prompt + answer, "labels": [-100] * len(prompt) + answer}] * 2
    # with patience: held-out rows of another answer, whose loss training soon raises
    other = tokenizer("print(sorted(words))\n")["input_ids"]
    held_out = [{"input_ids": prompt + other, "labels": [-100] * len(prompt) + other}] * 2
    trainer = sft_trainer(model, tokenizer, rows, output_dir=work / "sft" / "trainer",
                          frozen_prefix=True, lora=LoraSpec(rank=2), max_steps=max_steps,
                          learning_rate=1e-2, save_strategy="steps", save_steps=save_steps,
                          save_total_limit=1, seed=0, patience=patience,
                          eval_rows=held_out if patience else None)
    for callback in callbacks:
        trainer.add_callback(callback)
    return trainer


def adapter(trainer: Any) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" in n}


def test_a_lora_sft_run_cut_after_a_checkpoint_resumes_from_the_state_on_a_fresh_workdir(
        tmp_path):
    uncut = sft(tmp_path / "uncut")
    uncut.train()
    expected = adapter(uncut)

    work, folder = tmp_path / "machine-1", tmp_path / "state"
    cut = sft(work, [RunState(folder, work).callback(), StopAt(2).callback()])
    cut.train()
    assert cut.state.global_step == 2
    at_cut = adapter(cut)
    ckpt = "sft/trainer/checkpoint-2/"
    assert {ckpt + n for n in ("adapter_model.safetensors", "optimizer.pt", "scheduler.pt",
                               "rng_state.pth", "trainer_state.json.gz")} <= files(folder).keys()
    assert sum(map(len, files(folder).values())) < 1 << 20  # an adapter, not the model

    def resumed(drop: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
        fresh = tmp_path / f"machine-{len(drop) + 2}"
        RunState(folder, fresh).restore()
        for rel in drop:
            (fresh / rel).unlink()
        trainer = sft(fresh)
        trainer.train(resume_from_checkpoint=last_checkpoint(fresh / "sft" / "trainer"))
        assert trainer.state.global_step == 4
        return adapter(trainer)

    got = resumed()
    assert got.keys() == expected.keys()
    assert any(not torch.equal(got[n], at_cut[n]) for n in got)  # steps 3 and 4 ran
    for name in expected:
        assert torch.allclose(got[name], expected[name], atol=1e-6), name
    # the optimizer state is what makes it the same run: without it Adam starts over
    restarted = resumed(drop=(ckpt + "optimizer.pt",))
    assert any(not torch.allclose(restarted[n], expected[n], atol=1e-6) for n in expected)


class Steps:
    """Counts the optimizer steps a `train()` runs."""

    def __init__(self) -> None:
        self.count = 0

    def callback(self) -> Any:
        from transformers import TrainerCallback

        counter = self

        class _Count(TrainerCallback):
            def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                counter.count += 1

        return _Count()


def test_a_run_restored_at_its_last_checkpoint_takes_it_and_runs_no_step_more(tmp_path):
    """3 steps over 2 rows end mid-epoch: transformers 5 resuming that checkpoint runs a 4th
    step (it checks max_steps after a step; in GRPO one more group of episodes)."""
    work, folder = tmp_path / "machine-1", tmp_path / "state"
    done = sft(work, [RunState(folder, work).callback()], max_steps=3, save_steps=3)
    done.train()
    expected = adapter(done)

    def on_a_fresh_machine(name: str) -> tuple[Any, Steps, Path]:
        fresh = tmp_path / name
        RunState(folder, fresh).restore()
        steps = Steps()
        return sft(fresh, [steps.callback()], max_steps=3, save_steps=3), steps, fresh

    trainer, steps, fresh = on_a_fresh_machine("machine-2")
    train_resumed(trainer, fresh / "sft" / "trainer")
    assert steps.count == 0 and trainer.state.global_step == 3
    got = adapter(trainer)
    assert all(torch.equal(got[n], expected[n]) for n in expected)  # the checkpoint's adapter
    losses = [[e["loss"] for e in t.state.log_history if "loss" in e] for t in (trainer, done)]
    assert len(losses[0]) == 3 and losses[0] == losses[1]  # the run's own log, as it was
    # why: the plain resume runs one step past the end
    trainer, steps, fresh = on_a_fresh_machine("machine-3")
    trainer.train(resume_from_checkpoint=last_checkpoint(fresh / "sft" / "trainer"))
    assert steps.count == 1 and trainer.state.global_step == 4


def test_an_early_stopped_run_restored_elsewhere_ends_with_its_best_checkpoint(tmp_path):
    """SFT with held-out rows stops early, its best checkpoint kept beside its last. On a fresh
    machine (another workdir: the trainer's state names the best by the path it had) the run is
    taken as it is, with no step more, and ends with the best checkpoint's adapter."""
    work, folder = tmp_path / "machine-1", tmp_path / "state"
    done = sft(work, [RunState(folder, work).callback()], max_steps=30, save_steps=1, patience=1)
    done.train()
    best = Path(done.state.best_model_checkpoint).name
    last = f"checkpoint-{done.state.global_step}"
    assert done.state.global_step < 30 and best != last
    assert sorted(p.name for p in (folder / "sft" / "trainer").iterdir()) == sorted([best, last])
    expected = adapter(done)  # load_best_model_at_end: the best's

    fresh = tmp_path / "machine-2"
    RunState(folder, fresh).restore()
    steps = Steps()
    trainer = sft(fresh, [steps.callback()], max_steps=30, save_steps=1, patience=1)
    train_resumed(trainer, fresh / "sft" / "trainer")
    assert steps.count == 0 and trainer.state.global_step == done.state.global_step
    assert trainer.state.best_model_checkpoint == str(fresh / "sft" / "trainer" / best)
    got = adapter(trainer)
    assert all(torch.equal(got[n], expected[n]) for n in expected)


def test_a_changed_configuration_keeps_the_stages_before_the_first_one_it_changes(tmp_path):
    work = a_workdir(tmp_path)  # demos done, SFT begun
    folder = tmp_path / "state"
    RunState(folder, work).save()
    state = RunState(folder, tmp_path / "fresh")
    assert state.check({**CONFIG, "n_heldout": 9}) == []  # evaluation only: nothing begun
    assert json.loads((folder / "config.json").read_text())["n_heldout"] == 9
    new = {**CONFIG, "n_heldout": 9, "sft_val_fraction": 0.1, "grpo_top_p": 0.95}
    with pytest.raises(StateError, match="sft_val_fraction.*begun \\(sft\\).*--redo-changed"):
        state.check(new)
    assert (folder / "sft").is_dir()
    assert state.check(new, redo_changed=True) == ["sft"]
    assert sorted(files(folder)) == ["config.json", "demos/metrics.json",
                                     "demos/traces/teacher.jsonl.gz", "discarded.json"]
    assert json.loads((folder / "config.json").read_text()) == new
    assert state.check(new, redo_changed=True) == []  # the same command again: a resume
    with pytest.raises(StateError, match="differs in n_demo_tasks"):  # the demos themselves
        state.check({**new, "n_demo_tasks": 5})


def test_a_removed_stage_stays_on_the_books_once(tmp_path):
    """`--redo-changed` removes a finished SFT and a cut train-pass; the ledger keeps what they
    cost (the metrics' times; a cut stage's file-time span), once each though the state folder
    and then the workdir both remove them, as a resumed run does (check, restore, reconcile)."""
    work = a_workdir(tmp_path)
    write(work, "sft/metrics.json", json.dumps({"wall_s": 100.0, "cpu_s": 50.0}))
    for name, when in (("first.jsonl", 1_000_000), ("last.jsonl", 1_000_090)):
        write(work, f"train-pass/traces/{name}", "{}\n")
        os.utime(work / "train-pass/traces" / name, (when, when))
    folder = tmp_path / "state"
    RunState(folder, work).save()
    new = {**CONFIG, "sft_epochs": 3}

    state = RunState(folder, work)
    assert state.check(new, redo_changed=True) == ["sft", "train-pass"]
    state.restore()
    assert reconcile(work, new, redo_changed=True) == ["sft", "train-pass"]

    ledger = discarded(work)
    assert ledger == discarded(folder)
    assert [(e["stage"], e["complete"], e["wall_s"], e["cpu_s"], e["changed"]) for e in ledger] \
        == [("sft", True, 100.0, 50.0, ["sft_epochs"]),
            ("train-pass", False, 90.0, None, ["sft_epochs"])]
    RunState(folder, work).save()  # the ledger travels with the run, readable in a diff
    assert json.loads((folder / "discarded.json").read_text()) == ledger


def test_a_cut_stage_with_recorded_sittings_is_discarded_at_their_sum(tmp_path):
    """A stage cut in two sittings is on the books at their summed time, not at its files'
    span (which misses the time before its first file and after its last)."""
    work = a_workdir(tmp_path)
    write(work, "sft/trainer/checkpoint-1/adapter_model.safetensors", b"x")
    record_sitting(work / "sft", 30.0, 20.0, 0.0)
    record_sitting(work / "sft", 40.0, 25.0, 0.0)
    assert [s["wall_s"] for s in earlier_sittings(work / "sft")] == [30.0, 40.0]
    RunState(tmp_path / "state", work).save()
    assert json.loads((tmp_path / "state" / "sft" / "sittings.json").read_text()) == \
        earlier_sittings(work / "sft")  # plain: readable in a diff
    reconcile(work, {**CONFIG, "sft_epochs": 3}, redo_changed=True)
    (entry,) = discarded(work)
    assert (entry["stage"], entry["complete"], entry["wall_s"], entry["cpu_s"]) == \
        ("sft", False, 70.0, 45.0)


def test_a_stage_cut_in_one_sitting_and_finished_in_the_next_counts_both(tmp_path, monkeypatch):
    """The pipeline records the sitting a stage is cut in (here a Ctrl-C inside it), and the
    stage's metrics, when it ends in a later sitting, count both sittings' time."""
    import learning_curve

    sittings_run: list[float] = []

    def demos(self):
        time.sleep(0.3)
        sittings_run.append(time.monotonic())
        if len(sittings_run) == 1:
            raise KeyboardInterrupt
        return {"answer": 42}

    monkeypatch.setattr(learning_curve.Pipeline, "stage_demos", demos)
    monkeypatch.setattr(learning_curve, "preload", lambda: None)
    work = tmp_path / "work"

    def pipeline():
        return learning_curve.Pipeline(learning_curve.PRESETS["quick"], work,
                                       tmp_path / "results", progress=False)

    with pytest.raises(KeyboardInterrupt):
        pipeline().run(["demos"])
    (cut,) = earlier_sittings(work / "demos")
    assert 0.3 <= cut["wall_s"] < 30 and not (work / "demos" / "metrics.json").exists()
    # a run in progress counts the sittings of its unfinished stages in the budget spent
    times = pipeline().write_results()["times_total"]
    assert times["unfinished_wall_s"] == cut["wall_s"] and times["wall_s"] == 0
    assert times["spent_wall_h"] == round(cut["wall_s"] / 3600, 2)
    pipeline().run(["demos"])
    assert pipeline().write_results()["times_total"]["unfinished_wall_s"] == 0
    done = json.loads((work / "demos" / "metrics.json").read_text())
    assert done["answer"] == 42 and done["sittings"] == 2 and not done["cpu_s_partial"]
    assert cut["wall_s"] + 0.3 <= done["wall_s"] < cut["wall_s"] + 30
    assert done["cpu_s"] >= cut["cpu_s"]


def test_a_finished_runs_trainer_checkpoint_leaves_the_workdir_and_the_state(tmp_path,
                                                                              monkeypatch):
    """Nothing resumes a finished stage's trainer checkpoint (an adapter and its optimizer
    state): it is dropped when the stage ends, and a state saved before that rule (an lr-sweep
    rate's) loses it at the next run, while the weights the stage ends with stay."""
    import learning_curve

    def sft(self):
        for part in ("trainer/checkpoint-3", "model"):
            (self.stage_dir("sft") / part).mkdir(parents=True)
            (self.stage_dir("sft") / part / "adapter_model.safetensors").write_bytes(b"w" * 64)
        return {"optimizer_steps": 3}

    monkeypatch.setattr(learning_curve.Pipeline, "stage_sft", sft)
    monkeypatch.setattr(learning_curve, "preload", lambda: None)
    work, state = tmp_path / "work", tmp_path / "state"
    sweep = work / "lr-sweep"
    (sweep / "lr-2e-05" / "trainer" / "checkpoint-2").mkdir(parents=True)
    (sweep / "lr-2e-05" / "trainer" / "checkpoint-2" / "optimizer.pt").write_bytes(b"o" * 64)
    (sweep / "lr-2e-05" / "run.json").write_text(json.dumps({"score": 0.5}))
    (sweep / "metrics.json").write_text(json.dumps({"pick": 2e-05, "wall_s": 1.0,
                                                     "cpu_s": 1.0}))
    pipeline = learning_curve.Pipeline(learning_curve.PRESETS["quick"], work,
                                       tmp_path / "results", progress=False, state=state)
    pipeline.run(["sft"])
    for root in (work, state):
        assert (root / "sft" / "metrics.json").exists()
        assert (root / "sft" / "model" / "adapter_model.safetensors").exists()
        assert not (root / "sft" / "trainer").exists()
        assert (root / "lr-sweep" / "lr-2e-05").is_dir()
        assert not (root / "lr-sweep" / "lr-2e-05" / "trainer").exists()


def test_a_live_runs_workdir_refuses_a_second_run_and_is_reported_on_without_a_claim(tmp_path):
    """Two runs writing one workdir would corrupt its checkpoints and traces: a second is
    refused, naming the first's pid; `--report-only` reads the workdir while it runs; the claim
    goes with its process, however that ends (here SIGKILL)."""
    import dataclasses
    import subprocess

    import learning_curve
    from curve.config import STAGES, wanted
    from curve.process import WorkdirBusy, claim_workdir

    from harness_gym.training.report import readme_block

    work = tmp_path / "work"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from curve.process import claim_workdir; claim = claim_workdir(Path(sys.argv[1])); "
         "print('held', flush=True); time.sleep(600)", str(work)],
        cwd=REPO / "benchmarks", stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        preset = learning_curve.PRESETS["quick"]
        pipeline = learning_curve.Pipeline(preset, work, tmp_path / "results", progress=False)
        with pytest.raises(WorkdirBusy, match=f"in use by the run of pid {holder.pid} "):
            pipeline.run(["sft"])
        assert not (work / "sft").exists()  # refused before it wrote anything
        (work / "config.json").write_text(json.dumps(dataclasses.asdict(preset)))
        results = pipeline.run([])  # --report-only, beside the live run
        assert results["stages"] == {"eval": {}}
        assert results["stages_pending"] == wanted(list(STAGES), preset)  # and it says so
        assert "still to run: `demos`, `sft`," in readme_block(results, "learning_curve.json")
        assert (tmp_path / "results" / "learning_curve_quick.json").exists()
        assert (work / "run.pid").read_text() == f"{holder.pid}\n"  # still the live run's
    finally:
        holder.kill()
        holder.wait()
    with claim_workdir(work):  # the killed run's claim went with it
        assert (work / "run.pid").read_text() == f"{os.getpid()}\n"
