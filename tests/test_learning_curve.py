"""The learning-curve pipeline in its quick mode (tiny-vllm on a real vLLM CPU server, through the
real Pi CLI, LoRA): every stage leaves its checkpoint and metrics, the server serves the GRPO
rollouts (the trainer's merged weights synced each step) and every evaluation and is gone after
the run, the results file and plot come out, a second run resumes without redoing a stage, and
the run's state folder resumes it on an empty workdir (a fresh machine). Plus the statistics the
curve reports."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from harness_gym.engines.tiny_vllm import tiny_vllm_model_dir
from harness_gym.training.evaluation import (
    bootstrap_interval,
    recorded_episodes,
    summarize,
    wilson_interval,
)

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "learning_curve.py"
STAGES = ("demos", "sft", "train-pass", "lr-sweep", "grpo", "grpo-nopenalty", "grpo-flat",
          "eval-base", "eval-sft", "eval-grpo", "eval-grpo-nopenalty", "eval-grpo-flat")


sys.path.insert(0, str(REPO / "benchmarks"))
import learning_curve  # noqa: E402  (the script, for its plan and journal)
from curve.config import arm_stages  # noqa: E402
from curve.plan import plan as full_plan  # noqa: E402

QUICK = learning_curve.PRESETS["quick"]


def quick_test(fn):
    """The tests on the quick run: a real CLI and real training, minutes on a loaded machine."""
    return pytest.mark.slow(pytest.mark.timeout(1800)(fn))


def run_curve(*args: str, timeout: float = 2400) -> subprocess.CompletedProcess[str]:
    # finished runs' trainer checkpoints kept: the tests cut a finished run to resume it (that
    # they are dropped by default: test_curve_state)
    return subprocess.run([sys.executable, str(SCRIPT), *args, "--no-progress",
                           "--keep-checkpoints"],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if shutil.which("npm") is None:
        pytest.skip("Pi installs with npm")
    from harness_gym.engines.vllm_install import VLLMInstallError, find_vllm_python

    try:
        find_vllm_python(None)
    except VLLMInstallError as exc:
        pytest.skip(f"the quick run serves the policy on vLLM: {exc}")
    root = tmp_path_factory.mktemp("curve")
    work, results, state = root / "work", root / "results", root / "state"
    done = run_curve("--quick", "--workdir", str(work), "--results", str(results),
                     "--state", str(state))
    assert done.returncode == 0, done.stderr[-4000:]
    return {"work": work, "results": results, "log": done.stderr, "state": state,
            # as the first run wrote it (the resume tests rewrite the file)
            "first_results": json.loads((results / "learning_curve_quick.json").read_text())}


def metrics(quick: dict[str, Path], stage: str) -> dict:
    return json.loads((quick["work"] / stage / "metrics.json").read_text())


@quick_test
def test_the_demonstrations_are_teacher_episodes_through_pi_recorded_as_traces(quick):
    demos = metrics(quick, "demos")
    assert demos["summary"]["n_episodes"] == QUICK.n_demo_tasks
    assert demos["summary"]["n_passed"] >= 1  # the teacher solves family tasks
    (traces,) = (quick["work"] / "demos" / "traces").glob("*.jsonl")
    rows = [json.loads(line) for line in traces.read_text().splitlines()]
    assert len(rows) == QUICK.n_demo_tasks
    assert all(row["harness"] == "pi" and row["trace"] for row in rows)


@quick_test
def test_sft_leaves_a_trained_lora_adapter_and_its_losses(quick):
    sft = metrics(quick, "sft")
    assert sft["rows"] >= 1 and sft["optimizer_steps"] >= 1
    assert sft["losses"] and all(math.isfinite(x) for x in sft["losses"])
    assert len(sft["step_s"]) == sft["optimizer_steps"]
    assert 0 < sft["grad_tokens"] < sft["frozen_tokens"]  # the prompt ran without gradient
    saved = quick["work"] / "sft" / "model"
    assert json.loads((saved / "adapter_config.json").read_text())["r"] == QUICK.lora_rank
    assert not (saved / "model.safetensors").exists()  # the adapter only
    # the evaluation merged it: the base model's weights, changed only where LoRA wraps
    tuned = load_file(quick["work"] / ".merged" / "sft" / "model" / "model.safetensors")
    base = load_file(tiny_vllm_model_dir() / "model.safetensors")
    assert tuned.keys() == base.keys()
    changed = {k for k in base if not torch.equal(tuned[k], base[k])}
    targets = tuple(f"{t}.weight" for t in QUICK.lora_targets.split(","))
    assert changed and all(k.endswith(targets) for k in changed)
    assert (quick["work"] / ".merged" / "sft" / "model" / "tokenizer.json").exists()


@quick_test
def test_sft_holds_out_whole_demos_and_keeps_the_checkpoint_of_their_lowest_loss(quick):
    sft = metrics(quick, "sft")
    validation = sft["validation"]
    passed = {e["task_id"] for e in metrics(quick, "demos")["episodes"]
              if e["outcome"] == "passed"}
    assert len(validation["tasks"]) == 1 and set(validation["tasks"]) < passed
    assert validation["rows"] >= 1 and sft["rows"] >= 1  # the others trained on
    # measured at every checkpoint (each optimizer step in the quick run), with the mean
    # training loss since the one before
    evaluations = validation["evaluations"]
    assert [e["step"] for e in evaluations] == list(range(1, sft["optimizer_steps"] + 1))
    assert all(math.isfinite(e["val_loss"]) and math.isfinite(e["train_loss"])
               for e in evaluations)
    best = min(evaluations, key=lambda e: e["val_loss"])
    assert validation["best_step"] == best["step"]
    assert validation["best_val_loss"] == best["val_loss"]
    assert not validation["stopped_early"]  # no patience in the quick run
    openings = sft["validation_turn_openings"]  # each turn's first token, apart
    assert math.isfinite(openings["first_turn"]) and math.isfinite(openings["rest"])
    # the adapter the stage kept (and the server was given) is the best checkpoint's
    kept = load_file(quick["work"] / "sft" / "model" / "adapter_model.safetensors")
    at_best = load_file(quick["work"] / "sft" / "trainer" / f"checkpoint-{best['step']}"
                        / "adapter_model.safetensors")
    assert kept.keys() == at_best.keys()
    assert all(torch.equal(kept[k], at_best[k]) for k in kept)


@quick_test
def test_the_tier_is_calibrated_on_training_tasks_at_the_rollout_temperature(quick):
    calib = metrics(quick, "train-pass")
    config = QUICK
    assert calib["summary"]["n_episodes"] == config.n_calib_tasks * config.calib_samples
    assert calib["summary"]["samples_per_instance"] == config.calib_samples
    assert calib["temperature"] == config.grpo_temperature
    assert (calib["top_p"], calib["top_k"]) == (config.grpo_top_p, config.grpo_top_k)
    # each call of its episodes recorded the nucleus it sampled from
    (traces,) = (quick["work"] / "train-pass" / "traces").glob("*.jsonl")
    calls = [(t, p, k) for line in traces.read_text().splitlines()
             for segment in json.loads(line)["trace"] if segment["role"] == "agent"
             for t, p, k in zip(segment["sampling_temperature"], segment["sampling_top_p"],
                                segment["sampling_top_k"], strict=True)]
    assert calls and set(calls) == {(config.grpo_temperature, 0.95, 50)}
    assert calib["in_zone"] == (0.2 <= calib["summary"]["pass_at_1"] <= 0.7)
    assert all("symptom-train" in e["task_id"] for e in calib["episodes"])
    demonstrated = {e["task_id"] for e in metrics(quick, "demos")["episodes"]}
    assert not demonstrated & {e["task_id"] for e in calib["episodes"]}
    assert calib["pass_rate_by_kind"] and all(0 <= r <= 1 for r in
                                              calib["pass_rate_by_kind"].values())


@quick_test
def test_the_learning_rate_sweep_logs_each_rate_and_the_arms_take_its_pick(quick):
    sweep = metrics(quick, "lr-sweep")
    assert [r["learning_rate"] for r in sweep["runs"]] == [1e-4, 1e-3]
    assert all(len(r["steps"]) == 1 and r["score"] is not None for r in sweep["runs"])
    assert sweep["pick"] in (1e-4, 1e-3)
    assert sweep["pick"] == max(sweep["runs"], key=lambda r: r["score"])["learning_rate"]
    for arm in ("grpo", "grpo-nopenalty", "grpo-flat"):
        assert metrics(quick, arm)["learning_rate"] == sweep["pick"]


@quick_test
@pytest.mark.parametrize("arm", ["grpo", "grpo-nopenalty", "grpo-flat"])
def test_each_grpo_arm_samples_on_the_vllm_server_with_the_trainers_weights_of_each_step(
        quick, arm):
    grpo = metrics(quick, arm)
    assert [s["step"] for s in grpo["steps"]] == [1, 2]
    for step in grpo["steps"]:
        assert step["episodes"] == QUICK.grpo_group_size  # one group
        assert sum(step["outcomes"].values()) == QUICK.grpo_group_size
        assert step["rollout_s"] > 0 and step["train_s"] is not None
        # the rollouts of step N sampled the weights after N - 1 optimizer steps, synced in
        assert step["policy_versions"] == [step["step"] - 1]
        assert step["prefix_cache"] is None  # no in-process engine: the server served them
        # dynamic sampling: a group with no reward spread drew one more (the budget), and
        # the counts add up
        dynamic = step["dynamic_sampling"]
        assert dynamic["groups"] == 1 and dynamic["extra_draws"] <= 1
        assert dynamic["kept"] + dynamic["masked"] == 1
        assert dynamic["dropped_zero_variance"] >= dynamic["masked"]
        # every episode run is counted, the drawn group's too, and the batch's own passes
        assert dynamic["run_episodes"] == QUICK.grpo_group_size * (1 + dynamic["extra_draws"])
        if dynamic["refilled"] == 0:  # the rows trained on are the batch's own
            assert step["outcomes"].get("passed", 0) == dynamic["batch_passed"]
        assert dynamic["batch_passed"] <= dynamic["run_passed"] <= dynamic["run_episodes"]
    assert grpo["optimizer_steps"] == 2
    # scored under the rollouts' nucleus; what the trainer's weights left outside it is counted
    assert isinstance(grpo["tokens_outside_kept"], int) and grpo["tokens_outside_kept"] >= 0
    assert grpo["points"] == [{"step": 1}]  # kept along the run for the evaluation
    # adapters (LoRA), merged for the server when evaluated
    assert (quick["work"] / arm / "points" / "step-1" / "adapter_model.safetensors").exists()
    assert (quick["work"] / ".merged" / arm / "points" / "step-1" / "model.safetensors").exists()
    assert (quick["work"] / arm / "model" / "adapter_model.safetensors").exists()
    # resumable: the adapter, its optimizer state, scheduler, RNG and trainer state
    checkpoint = quick["work"] / arm / "trainer" / "checkpoint-2"
    assert {"adapter_model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth",
            "trainer_state.json"} <= {p.name for p in checkpoint.iterdir()}
    assert grpo["reward"] == {"grpo": {"tool_penalty": 0.05},
                              "grpo-nopenalty": {"tool_penalty": 0.0},
                              "grpo-flat": {"tool_penalty": 0.05, "penalty": "flat"}}[arm]


@quick_test
@pytest.mark.parametrize("checkpoint", ["base", "sft", "grpo", "grpo-nopenalty", "grpo-flat"])
def test_each_checkpoint_is_evaluated_on_held_out_tasks_sampled_and_greedy(quick, checkpoint):
    evaluation = metrics(quick, f"eval-{checkpoint}")
    config = QUICK
    summary = evaluation["summary"]
    assert summary["n_episodes"] == config.n_heldout * config.eval_samples
    assert summary["n_instances"] == config.n_heldout
    assert summary["samples_per_instance"] == config.eval_samples
    assert sum(summary["outcomes"].values()) == summary["n_episodes"]
    low, high = summary["pass_at_1_ci"]
    assert 0 <= low <= summary["pass_at_1"] <= high <= 1
    assert evaluation["sampling"]["temperature"] == config.grpo_temperature
    assert evaluation["sampling"]["top_p"] == config.grpo_top_p == 0.95
    greedy = summary["greedy"]
    assert greedy["n_episodes"] == config.n_heldout and greedy["samples_per_instance"] == 1
    heldout = {e["task_id"] for e in evaluation["episodes"] + greedy["episodes"]}
    assert len(heldout) == config.n_heldout and all("symptom-heldout" in t for t in heldout)
    assert evaluation["server"]["weight_loads"] >= 1  # the checkpoint's weights went in
    if checkpoint.startswith("grpo"):  # the point along the run and the final weights
        assert [p["step"] for p in evaluation["points"]] == [1, 2]
        assert evaluation["points"][-1]["pass_at_1"] == summary["pass_at_1"]
        for point in evaluation["points"]:
            assert 0 <= point["pass_at_1"] <= 1 and 0 <= point["greedy_pass_at_1"] <= 1


@quick_test
def test_one_vllm_server_served_the_run_and_none_of_its_processes_is_left(quick):
    from harness_gym.engines.vllm_server import _group_alive

    groups = {metrics(quick, f"eval-{c}")["server"]["process_group"]
              for c in ("base", "sft", "grpo", "grpo-nopenalty", "grpo-flat")}
    (group,) = groups  # the same server for every evaluation
    assert group is not None and not _group_alive(group)
    assert quick["log"].count("vLLM server for") == 1
    assert quick["log"].count("vLLM server: stopping") == 1


@quick_test
def test_the_results_file_holds_every_stage_and_the_configuration_with_a_plot(quick):
    results = json.loads((quick["results"] / "learning_curve_quick.json").read_text())
    assert results["mode"] == "quick" and results["config"]["policy"] == "tiny-vllm"
    assert set(results["stages"]) == {"demos", "sft", "train-pass", "lr-sweep", "grpo",
                                      "grpo-nopenalty", "grpo-flat", "eval"}
    assert set(results["stages"]["eval"]) == {"base", "sft", "grpo", "grpo-nopenalty",
                                              "grpo-flat"}
    assert set(results["times"]) == set(STAGES) and results["stages_pending"] == []
    assert all(t["wall_s"] > 0 and t["cpu_s"] >= 0 for t in results["times"].values())
    assert results["calibration"]["sft_train_pass_at_temperature"] == \
        results["stages"]["train-pass"]["summary"]["pass_at_1"]
    assert "sft_pass_at_1" in results["targets"] and "flat_shows_the_trap" in results["targets"]
    summary = results["summary"]
    assert set(summary) == {"heldout_instances", "samples_per_instance", "checkpoints",
                            "grpo_gain_points", "grpo_gain_ci", "tool_calls_drop_pct"}
    assert summary["heldout_instances"] == QUICK.n_heldout
    assert summary["samples_per_instance"] == QUICK.eval_samples
    assert set(summary["checkpoints"]) == {"base", "sft", "grpo_gated", "grpo_nopenalty",
                                           "grpo_flat"}
    for name, figures in summary["checkpoints"].items():
        stage = {"grpo_gated": "grpo", "grpo_nopenalty": "grpo-nopenalty",
                 "grpo_flat": "grpo-flat"}.get(name, name)
        evaluated = results["stages"]["eval"][stage]
        assert set(figures) == {"pass_at_1", "pass_at_1_ci", "tool_calls_solved", "quit_rate"}
        assert figures["pass_at_1"] == evaluated["pass_at_1"]
        assert 0 <= figures["pass_at_1"] <= 1
        assert figures["quit_rate"] is None or 0 <= figures["quit_rate"] <= 1
    low, high = summary["grpo_gain_ci"]
    assert low <= summary["grpo_gain_points"] <= high
    assert results["paired"]["grpo - sft"]["points"] == summary["grpo_gain_points"]
    assert results["paired"]["grpo - sft"]["n_instances"] == QUICK.n_heldout
    assert "tool_calls_drop_pct" in summary
    png = (quick["results"] / "learning_curve_quick.png").read_bytes()
    assert png.startswith(b"\x89PNG")


@quick_test
def test_a_second_run_resumes_and_redoes_nothing(quick):
    stamps = {s: (quick["work"] / s / "metrics.json").stat().st_mtime_ns for s in STAGES}
    again = run_curve("--quick", "--workdir", str(quick["work"]), "--results",
                      str(quick["results"]), timeout=900)
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stderr.count("done earlier, skipped") == len(STAGES)
    assert stamps == {s: (quick["work"] / s / "metrics.json").stat().st_mtime_ns
                      for s in STAGES}


def state_files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@quick_test
def test_the_state_folder_holds_adapters_and_compressed_traces_and_no_full_weights(quick):
    files = state_files(quick["state"])
    assert "config.json" in files and all(f"{s}/metrics.json" in files for s in STAGES)
    # no full weights (an adapter is adapter_model.safetensors), no local derivatives
    assert not [n for n in files if n.startswith(".merged") or Path(n).name in
                {"model.safetensors", "tokenizer.json", "run.pid"} or n.endswith(".jsonl")]
    assert any(n.endswith("/adapter_model.safetensors") for n in files)
    assert any(n.startswith("demos/traces/") and n.endswith(".jsonl.gz") for n in files)
    checkpoint = "grpo/trainer/checkpoint-2/"
    assert {checkpoint + f for f in ("adapter_model.safetensors", "optimizer.pt", "scheduler.pt",
                                     "rng_state.pth", "trainer_state.json.gz")} <= files.keys()
    assert not any(n.startswith("grpo/trainer/checkpoint-1/") for n in files)  # rotated out
    sizes = quick["first_results"]["state"]
    assert sizes["bytes_total"] == sum(len(b) for b in files.values())
    assert set(sizes["bytes_by_stage"]) == {*STAGES, "config.json"}


def import_state(quick: dict[str, Path], root: Path, *, drop: tuple[str, ...] = ()) -> Path:
    """The quick run's state as a fresh machine gets it (a copy), less the paths `drop`."""
    state = root / "state"
    shutil.copytree(quick["state"], state)
    for rel in drop:
        path = state / rel
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    return state


@quick_test
def test_an_empty_workdir_resumes_from_the_state_folder_with_every_stage_done(quick, tmp_path):
    state = import_state(quick, tmp_path)
    before = state_files(state)
    work = tmp_path / "work"
    again = run_curve("--quick", "--workdir", str(work), "--results", str(tmp_path / "results"),
                      "--state", str(state), timeout=900)
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stderr.count("done earlier, skipped") == len(STAGES)
    assert "vLLM server for" not in again.stderr  # nothing to serve: no stage ran
    for stage in STAGES:
        assert metrics({"work": work}, stage) == metrics(quick, stage)
    demos = sorted((work / "demos" / "traces").glob("*.jsonl"))  # decompressed, as they were
    assert [p.read_bytes() for p in demos] == \
        [p.read_bytes() for p in sorted((quick["work"] / "demos" / "traces").glob("*.jsonl"))]
    assert state_files(state) == before  # saved again: not a byte changed


@quick_test
def test_a_run_cut_inside_its_stages_resumes_on_a_fresh_machine_from_the_state(quick, tmp_path):
    """What a kill leaves (episodes recorded, trainer checkpoints, GRPO groups journaled, no
    stage marked done), committed as the state and imported into an empty workdir, is taken
    up again, not redone: SFT and `grpo-flat` from their trainer checkpoints (adapter and
    optimizer state), `grpo` from its journal (the kill came before the step's checkpoint),
    the evaluation from its recorded episodes."""
    cut = ("sft", "grpo", "grpo-flat", "eval-grpo")
    state = import_state(quick, tmp_path, drop=(*(f"{s}/metrics.json" for s in cut),
                                                "grpo/trainer"))
    work = tmp_path / "work"
    again = run_curve("--quick", "--workdir", str(work), "--results", str(tmp_path / "results"),
                      "--state", str(state), "--stages", ",".join(cut), timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    resumed = {s: metrics({"work": work}, s) for s in cut}
    sft = resumed["sft"]  # resumed from its imported checkpoint: no step ran again
    assert sft["optimizer_steps"] == metrics(quick, "sft")["optimizer_steps"]
    assert sft["step_s"] == []
    assert "grpo step 1 group 0: replayed" in again.stderr  # no episode ran again
    assert "grpo step 2 group 0: replayed" in again.stderr
    assert "grpo-flat step" not in again.stderr  # at its last step already: nothing rolled out
    for arm in ("grpo", "grpo-flat"):
        assert [s["outcomes"] for s in resumed[arm]["steps"]] == \
            [s["outcomes"] for s in metrics(quick, arm)["steps"]]
        assert resumed[arm]["optimizer_steps"] == 2
    assert resumed["eval-grpo"]["episodes"] == metrics(quick, "eval-grpo")["episodes"]
    assert "eval-grpo: done" in again.stderr
    for stage in cut:  # the state has them again
        assert (state / stage / "metrics.json").exists()


def test_a_torn_trace_row_is_cut_off_and_its_episode_runs_again(tmp_path):
    rows = [{"task_id": f"t{i}", "outcome": "passed", "reward": 1.0, "n_tool_calls": 2,
             "n_llm_calls": 3, "duration_s": 1.5, "error": None, "trace": []} for i in range(2)]
    whole = "".join(json.dumps(r) + "\n" for r in rows)
    path = tmp_path / "run.jsonl"
    path.write_text(whole + json.dumps(rows[0])[:40])  # killed while writing the third row
    assert [e["task_id"] for e in recorded_episodes(tmp_path)] == ["t0", "t1"]
    assert path.read_text() == whole  # the file reads cleanly again (harness_gym.training.sft)
    assert recorded_episodes(tmp_path / "missing") == []


@quick_test
def test_the_plan_costs_the_full_preset_from_per_unit_times(quick):
    results = quick["first_results"]
    full = learning_curve.PRESETS["full"]
    plan = full_plan(full, results)
    expected = plan["expected_s"]
    assert expected["total"] == pytest.approx(sum(v for k, v in expected.items()
                                                  if k != "total"))
    units = plan["units"]
    assert expected["demos"] == pytest.approx(full.n_demo_tasks * units["demo_episode_s"])
    assert plan["sizes"]["grpo_episodes"] == (full.grpo_steps * full.grpo_groups_per_step
                                              * full.grpo_group_size
                                              * len(arm_stages(full)))


def test_the_full_presets_plan_retimes_the_calibrations_evaluations_at_its_concurrency():
    """The committed calibration ran each evaluation's 4 samples 4 at a time and its 2 greedy
    episodes 2 at a time; the full run runs 8 at a time. The plan re-times them by the vLLM
    server's measured episodes per hour at each level (engines_cpu.json), leaves the server's
    startup out of train-pass's episodes, and costs SFT's held-out rows."""
    from curve.plan import throughput_at, vllm_throughput

    results = REPO / "benchmarks" / "results"
    calibration = json.loads((results / "learning_curve_calibrate.json").read_text())
    throughput = vllm_throughput(json.loads((results / "engines_cpu.json").read_text()))
    assert throughput_at({1: 100.0, 4: 400.0}, 2) == 200.0
    assert throughput_at({1: 100.0, 4: 400.0}, 8) == 400.0
    full = learning_curve.PRESETS["full"]
    planned = full_plan(full, calibration, throughput)
    assert calibration["plan"]["expected_s"] == planned["expected_s"]  # committed: this code's
    units, expected = planned["units"], planned["expected_s"]
    base = calibration["stages"]["eval"]["base"]
    t = {level: throughput_at(throughput, level) for level in (2, 4, 8)}
    assert units["eval_episode_s"]["base"] == pytest.approx(
        base["eval_s"] / (4 / t[4] + 2 / t[2]) / t[8])
    assert units["eval_episode_s"]["base"] < units["eval_episode_s_measured"]["base"]
    assert expected["eval-base"] == pytest.approx(250 * units["eval_episode_s"]["base"])
    assert full_plan(full, calibration)["units"]["eval_episode_s"] == \
        units["eval_episode_s_measured"]  # no throughput: as measured
    train_pass = calibration["stages"]["train-pass"]
    assert units["calib_episode_s"] == pytest.approx(
        (train_pass["wall_s"] - units["vllm_startup_s"]) / 8)
    sizes = planned["sizes"]  # 90 demos trained on each epoch, 10 measured at each checkpoint
    assert (sizes["sft_rows_expected"], sizes["sft_val_rows_expected"]) == (90, 10)
    checkpoints = 90 * full.sft_epochs / full.sft_grad_accum / full.sft_save_steps
    assert sizes["sft_checkpoints_expected"] == pytest.approx(checkpoints)
    assert expected["sft"] == pytest.approx(
        (90 * full.sft_epochs + checkpoints * 10 / 3) * units["sft_row_s"])
    # the floors, and where they stand against the 10 h
    assert full.n_heldout >= 50 and full.eval_samples >= 4 and full.grpo_group_size >= 4
    assert full.grpo_steps >= 30 and len(arm_stages(full)) == 3
    assert planned["fits_on_all_cores"] and not planned["fits"]


@quick_test
def test_a_workdir_refuses_a_run_with_another_configuration(quick):
    other = run_curve("--quick", "--workdir", str(quick["work"]), "--results",
                      str(quick["results"]), "--set", "n_heldout=3", timeout=900)
    assert other.returncode != 0 and "differs in n_heldout" in other.stderr
    assert "--redo-changed" in other.stderr


# --- the statistics -------------------------------------------------------------------------


def test_wilson_intervals_match_the_textbook_values():
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson_interval(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson_interval(50, 50) == pytest.approx((0.9287, 1.0), abs=1e-4)
    narrow, wide = wilson_interval(30, 100), wilson_interval(3, 10)
    assert narrow[1] - narrow[0] < wide[1] - wide[0]


def test_a_bootstrap_interval_brackets_the_mean_and_narrows_with_more_data():
    small = bootstrap_interval([1, 2, 3, 4, 5])
    large = bootstrap_interval([1, 2, 3, 4, 5] * 20)
    assert small[0] < 3 < small[1] and large[0] < 3 < large[1]
    assert large[1] - large[0] < small[1] - small[0]
    assert bootstrap_interval([]) is None
    assert bootstrap_interval([4, 4, 4]) == (4.0, 4.0)


def test_pass_at_1_leaves_out_infra_errors_and_counts_timeouts_as_failures():
    episodes = ([{"outcome": "passed", "n_tool_calls": 2, "task_id": f"a{i}"} for i in range(3)]
                + [{"outcome": "timeout", "n_tool_calls": 30, "task_id": "b"}]
                + [{"outcome": "infra_error", "n_tool_calls": 0, "task_id": "c"}] * 2)
    summary = summarize(episodes)
    assert summary["n_scored"] == 4 and summary["pass_at_1"] == 0.75
    assert summary["outcomes"]["timeout"] == 1 and summary["outcomes"]["infra_error"] == 2
    assert summary["tool_calls_solved"] == 2.0 and summary["tool_calls_all"] == 9.0


def test_the_readme_shows_the_committed_results_it_names():
    from harness_gym.training.report import README_BEGIN, load_results, readme_block

    readme = (REPO / "README.md").read_text()
    begin = readme.index(README_BEGIN)
    name = readme[begin + len(README_BEGIN):].split(" ", 1)[0]
    end = readme.index("<!-- learning-curve:end -->", begin) + len("<!-- learning-curve:end -->")
    results = load_results(REPO / "benchmarks" / "results" / name)
    assert readme[begin:end] == readme_block(results, name), \
        "regenerate: python benchmarks/learning_curve.py --report-only --readme (same preset)"
    assert (REPO / "benchmarks" / "results" / name).with_suffix(".png").exists()
