"""A learning curve's results file as a plot and a table: pass@1 and tool calls per checkpoint,
and the GRPO reward over steps (used by benchmarks/learning_curve.py and
notebooks/learning_curve.ipynb)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["CHECKPOINTS", "README_BEGIN", "README_END", "load_results", "plot_learning_curve",
           "readme_block", "replace_readme_block", "results_table"]

CHECKPOINTS = ("base", "sft", "grpo", "grpo-nopenalty", "grpo-flat")
LABELS = {"base": "base", "sft": "SFT", "grpo": "SFT + GRPO",
          "grpo-nopenalty": "GRPO, no penalty", "grpo-flat": "GRPO, flat penalty"}


def load_results(path: str | Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def _evals(results: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    evals = results["stages"].get("eval", {})
    return [(name, evals[name]) for name in CHECKPOINTS if name in evals]


def results_table(results: Mapping[str, Any]) -> str:
    """A Markdown table: one row per checkpoint."""
    lines = ["| checkpoint | pass@1 (95% CI) | solved / scored | tool calls on solved (95% CI) "
             "| outcomes |", "|---|---|---|---|---|"]
    for name, s in _evals(results):
        low, high = s["pass_at_1_ci"]
        tools = "n/a"
        if s["tool_calls_solved"] is not None:
            tl, th = s["tool_calls_solved_ci"]
            tools = f"{s['tool_calls_solved']:.2f} ({tl:.2f}-{th:.2f})"
        outcomes = ", ".join(f"{k} {v}" for k, v in s["outcomes"].items() if v)
        lines.append(f"| {LABELS[name]} | {s['pass_at_1']:.0%} ({low:.0%}-{high:.0%}) | "
                     f"{s['n_passed']} / {s['n_scored']} | {tools} | {outcomes} |")
    return "\n".join(lines)


def plot_learning_curve(results: Mapping[str, Any], path: str | Path | None = None) -> Any:
    """The figure (matplotlib): pass@1 with Wilson intervals, mean tool calls on solved instances
    with bootstrap intervals, and the GRPO reward per step. Saved as PNG when `path` is given."""
    import matplotlib

    if path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    evals = _evals(results)
    names = [LABELS[n] for n, _ in evals]
    fig, (ax_pass, ax_tools, ax_reward) = plt.subplots(1, 3, figsize=(14, 4.2))

    rates = [s["pass_at_1"] for _, s in evals]
    # Wilson bounds at 0 or 1 come back a rounding error past the rate (1e-17): clamp.
    below = [max(0.0, r - s["pass_at_1_ci"][0]) for r, (_, s) in zip(rates, evals, strict=True)]
    above = [max(0.0, s["pass_at_1_ci"][1] - r) for r, (_, s) in zip(rates, evals, strict=True)]
    ax_pass.errorbar(names, rates, yerr=[below, above], fmt="o-", capsize=5)
    ax_pass.set_ylim(0, 1)
    ax_pass.set_title("held-out pass@1 (95% Wilson CI)")

    solved = [(LABELS[n], s) for n, s in evals if s["tool_calls_solved"] is not None]
    if solved:
        means = [s["tool_calls_solved"] for _, s in solved]
        ax_tools.errorbar([n for n, _ in solved], means, capsize=5, fmt="o-",
                          yerr=[[m - s["tool_calls_solved_ci"][0] for m, (_, s) in
                                 zip(means, solved, strict=True)],
                                [s["tool_calls_solved_ci"][1] - m for m, (_, s) in
                                 zip(means, solved, strict=True)]])
    else:
        ax_tools.text(0.5, 0.5, "no solved instances", ha="center", transform=ax_tools.transAxes)
    ax_tools.set_title("tool calls on solved (95% bootstrap CI)")

    lowest = -0.05
    for arm in CHECKPOINTS[2:]:  # each GRPO arm's rollouts
        steps = results["stages"].get(arm, {}).get("steps", [])
        if steps:
            x = [s["step"] for s in steps]
            ax_reward.plot(x, [s["reward_mean"] for s in steps], "o-",
                           label=f"{LABELS[arm]}: mean reward")
            ax_reward.plot(x, [s["pass_rate"] for s in steps], "s--", alpha=0.7,
                           label=f"{LABELS[arm]}: pass rate")
            lowest = min(lowest, *(s["reward_mean"] - 0.05 for s in steps))  # flat: below 0
    if ax_reward.lines:
        ax_reward.legend(fontsize="small")
    ax_reward.set_ylim(lowest, 1.05)
    ax_reward.set_xlabel("GRPO step")
    ax_reward.set_title("GRPO rollouts (train tasks)")

    model = results.get("config", {}).get("policy", "?")
    fig.suptitle(f"harness-gym learning curve: {model} through Pi ({results.get('mode', '?')})")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


README_BEGIN = "<!-- learning-curve:begin "
README_END = "<!-- learning-curve:end -->"
_MODES = {
    "full": "the full run",
    "calibrate": "the calibration run (SmolLM2, a handful of each unit: NOT the full run)",
    "quick": "the quick run (the tiny random model: proves the stages run, learns nothing)",
}


def readme_block(results: Mapping[str, Any], name: str) -> str:
    """The README's learning-curve block for the results file `name` (in benchmarks/results):
    which run it is, its plot, its table and the targets as measured. Generated, never edited
    by hand, so the README cannot drift from the committed figures (a test compares them)."""
    config, evals = results["config"], results["stages"].get("eval", {})
    sizes = (f"{config['n_demo_tasks']} demonstration tasks, "
             f"{config['grpo_steps']} GRPO step(s) of {config['grpo_groups_per_step']} group(s) "
             f"of {config['grpo_group_size']}, {next(iter(evals.values()))['n_episodes'] if evals else 0} "
             "held-out instances")
    lines = [
        f"{README_BEGIN}{name} -->",
        f"From `benchmarks/results/{name}`: {_MODES.get(results['mode'], results['mode'])}; "
        f"policy `{config['policy']}`, {sizes}.",
        "",
        f"![learning curve](benchmarks/results/{Path(name).with_suffix('.png').name})",
        "",
        results_table(results),
    ]
    targets = results.get("targets") or {}
    if targets:
        lines += ["", "Targets as measured: " + ", ".join(
            f"`{k}` = {v:.3g}" if isinstance(v, float) else f"`{k}` = {v}"
            for k, v in targets.items()) + "."]
    plan = results.get("plan") or {}
    if plan.get("expected_s"):
        u, z, hours = plan["units"], plan["sizes"], plan["expected_s"]["total"] / 3600
        evals = u["eval_episode_s"].values()
        lines += ["", f"The full run's plan, from the calibration's per-unit wall times (episodes up "
                  f"to 4 at a time): demo episode {u['demo_episode_s']:.0f} s, SFT row "
                  f"{u['sft_row_s']:.0f} s, GRPO episode {u['grpo_episode_s']:.0f} s + "
                  f"{u['grpo_row_train_s']:.0f} s of training, held-out episode "
                  f"{min(evals):.0f}-{max(evals):.0f} s; {z['demo_tasks']} demos, "
                  f"{z['sft_epochs']:g} SFT epochs, {z['grpo_steps']} GRPO steps of "
                  f"{z['grpo_episodes'] // max(1, z['grpo_steps'])} episodes, {z['heldout']} "
                  f"held-out instances per checkpoint: {hours:.1f} h expected."]
    lines.append(README_END)
    return "\n".join(lines)


def replace_readme_block(readme: str, block: str) -> str:
    """`readme` with its learning-curve block replaced by `block`."""
    begin = readme.index(README_BEGIN)
    end = readme.index(README_END, begin) + len(README_END)
    return readme[:begin] + block + readme[end:]
