"""The results' headline figures: per checkpoint, paired differences, the issue's targets."""

from __future__ import annotations

from collections import Counter
from typing import Any

from .config import SUMMARY_NAMES


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
    if grpo and flat:  # the trap: lower pass@1 or more quitting than the gated arm, CIs apart
        from harness_gym.training.evaluation import instance_quit_rates, paired_difference

        gap = paired_difference(grpo["episodes"], flat["episodes"])
        quits = paired_difference(grpo["episodes"], flat["episodes"], rates=instance_quit_rates)
        out["flat_minus_gated_points"], out["flat_minus_gated_ci"] = gap["points"], gap["ci"]
        out["flat_minus_gated_quit_points"] = quits["points"]
        out["flat_minus_gated_quit_ci"] = quits["ci"]
        out["flat_shows_the_trap"] = bool((gap["ci"] is not None and gap["ci"][1] < 0)
                                          or (quits["ci"] is not None and quits["ci"][0] > 0))
    return out


def brief(evaluated: dict[str, Any]) -> dict[str, Any]:
    """An evaluation's headline figures (a point along a GRPO run)."""
    fields = ("pass_at_1", "pass_at_1_ci", "tool_calls_solved", "quit_rate", "n_passed",
              "n_scored", "outcomes")
    return {**{f: evaluated[f] for f in fields},
            "greedy_pass_at_1": evaluated["greedy"]["pass_at_1"]}


def tool_call_counts(episodes: list[dict[str, Any]]) -> dict[str, int]:
    """How many passing episodes made each number of tool calls (the churn SFT inherits)."""
    counts = Counter(e["n_tool_calls"] for e in episodes if e["outcome"] == "passed")
    return {str(k): v for k, v in sorted(counts.items())}


def sweep_score(steps: list[dict[str, Any]]) -> float | None:
    """A sweep run's score: the mean rollout reward of its steps after the first (whose
    rollouts sample the SFT weights whatever the rate); with one step, that step's."""
    later = [s for s in steps if s["step"] > 1] or steps
    return sum(s["reward_mean"] for s in later) / len(later) if later else None
