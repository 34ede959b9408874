"""The full run's plan from a calibration run's per-unit times."""

from __future__ import annotations

from itertools import pairwise
from statistics import median
from typing import Any

from .config import ARMS, BUDGET_S, CurveConfig, arm_stages


def plan(config: CurveConfig, calibration: dict[str, Any],
         throughput: dict[int, float] | None = None) -> dict[str, Any]:
    """The full run's expected wall time per stage, from a calibrate run's per-unit times
    (`calibration` is its results file). A unit is a stage's wall time over its episodes; SFT and
    GRPO training are timed per row; a GRPO episode's unit includes the dynamic-sampling
    refills at the calibration's rate.

    Concurrency: the calibration's evaluations ran 2 x 2 samples and 2 greedy episodes, so 4
    and 2 at a time where the full run's run `concurrent_episodes` at a time. With `throughput`
    (the vLLM server's episodes per hour at each concurrency level, as
    `benchmarks/engines_cpu.py` measured them) an evaluation's episodes are re-timed at the
    full run's level (`eval_episode_s_at`); without it they are costed as measured. The
    train-pass stage started the vLLM server in the calibration: its startup is not costed
    per episode (it is a line of its own)."""
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
    measured = {name: e["eval_s"] / e["episodes_run"] for name, e in evals.items()}
    eval_units = {name: eval_episode_s_at(e["eval_s"], cal, c.concurrent_episodes, throughput)
                  for name, e in evals.items()}
    train_pass = st["train-pass"]
    startup = max((e.get("server") or {}).get("startup_s") or 0 for e in evals.values())
    served_first = cal.engine == "vllm"  # train-pass is the first stage the server serves
    units = {
        "demo_episode_s": demos["wall_s"] / demos["summary"]["n_episodes"],
        "demo_pass_rate": demo_pass,
        "sft_rows_per_passing_demo": sft_rows_per_pass,
        "sft_row_s": sft_row_s(st["sft"], cal),
        "calib_episode_s": (train_pass["wall_s"] - (startup if served_first else 0))
        / train_pass["summary"]["n_episodes"],
        "grpo_episode_s": sum(s["rollout_s"] for s in grpo) / grpo_episodes,
        "grpo_row_train_s": sum(s["train_s"] or 0 for s in grpo) / grpo_episodes,
        "eval_episode_s": eval_units,
        "eval_episode_s_measured": measured,
        "eval_concurrency": {"calibration": eval_levels(cal), "full": c.concurrent_episodes,
                             "throughput": throughput},
        "vllm_startup_s": startup,
    }
    sft_rows = c.n_demo_tasks * demo_pass * sft_rows_per_pass
    # held out: not trained on, their loss measured (a forward, about a third of a training
    # row's forward+backward) at every checkpoint
    val_rows = sft_rows * c.sft_val_fraction
    sft_train_rows = sft_rows - val_rows
    sft_checkpoints = sft_train_rows * c.sft_epochs / c.sft_grad_accum / c.sft_save_steps
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
        "sft": (sft_train_rows * c.sft_epochs + sft_checkpoints * val_rows / 3)
        * units["sft_row_s"],
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
        "sft": (sft_train_rows * c.sft_epochs + sft_checkpoints * val_rows / 3)
        * cpu["sft_row"],
        "train-pass": c.n_calib_tasks * c.calib_samples * cpu["train-pass"],
        "lr-sweep": sweep_episodes * cpu["grpo_episode"],
        "grpo": grpo_episodes_full * cpu["grpo_episode"],
        "eval": (per_eval * (2 + arms) + per_point * points * arms) * cpu["eval_episode"],
    }
    expected_cpu["total"] = sum(expected_cpu.values())
    cores = (calibration.get("machine") or {}).get("cores") or 2
    return {"units": units, "cpu_units": cpu, "expected_cpu_s": expected_cpu,
            "expected_wall_s_all_cores": expected_cpu["total"] / cores,
            "sizes": {"demo_tasks": c.n_demo_tasks, "sft_rows_expected": sft_train_rows,
                      "sft_val_rows_expected": val_rows,
                      "sft_checkpoints_expected": sft_checkpoints,
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


def eval_levels(cal: CurveConfig) -> dict[str, int]:
    """How many episodes ran at a time in a calibration's evaluation of one checkpoint: its
    samples, then its greedy episodes."""
    return {"sampled": min(cal.concurrent_episodes, cal.n_heldout * cal.eval_samples),
            "greedy": min(cal.concurrent_episodes, cal.n_heldout)}


def eval_episode_s_at(eval_s: float, cal: CurveConfig, level: int,
                      throughput: dict[int, float] | None) -> float:
    """An evaluation's wall time per episode with `level` episodes at a time, from one that
    took `eval_s` at the calibration's levels (`eval_levels`): its time is split by the
    server's throughput at each level (an episode at level c takes 1 / episodes_per_h(c)), so
    the time an episode takes at `level` is eval_s x (1/t(level)) / sum(n_i / t(c_i))."""
    levels = eval_levels(cal)
    counts = {"sampled": cal.n_heldout * cal.eval_samples, "greedy": cal.n_heldout}
    if not throughput:
        return eval_s / sum(counts.values())
    rate = {name: throughput_at(throughput, levels[name]) for name in levels}
    return eval_s / sum(counts[name] / rate[name] for name in counts) / throughput_at(
        throughput, level)


def throughput_at(throughput: dict[int, float], level: int) -> float:
    """Episodes per hour at `level`, linear between the measured levels (the nearest outside
    them)."""
    points = sorted((int(k), float(v)) for k, v in throughput.items())
    if level <= points[0][0]:
        return points[0][1]
    for (lo, a), (hi, b) in pairwise(points):
        if level <= hi:
            return a + (b - a) * (level - lo) / (hi - lo)
    return points[-1][1]


def vllm_throughput(engines_cpu: dict[str, Any]) -> dict[int, float]:
    """The vLLM server's episodes per hour by concurrency level, from `engines_cpu.json`."""
    return {int(level): row["vllm"]["episodes_per_h"]
            for level, row in engines_cpu["summary"].items() if "vllm" in row}


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
