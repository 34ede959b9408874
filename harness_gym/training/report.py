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
    """A Markdown table: one row per checkpoint (sampled pass@1, greedy where measured)."""
    lines = [("| checkpoint | pass@1 (95% CI) | solved / scored | greedy pass@1 "
             "| tool calls on solved (95% CI) | quit rate | outcomes |"),
             "|---|---|---|---|---|---|---|"]
    for name, s in _evals(results):
        low, high = s["pass_at_1_ci"]
        tools = "n/a"
        if s["tool_calls_solved"] is not None:
            tl, th = s["tool_calls_solved_ci"]
            tools = f"{s['tool_calls_solved']:.2f} ({tl:.2f}-{th:.2f})"
        greedy = s.get("greedy")
        greedy_text = "n/a" if greedy is None else (
            f"{greedy['pass_at_1']:.0%} ({greedy['n_passed']} / {greedy['n_scored']})")
        quit_rate = "n/a" if s.get("quit_rate") is None else f"{s['quit_rate']:.0%}"
        outcomes = ", ".join(f"{k} {v}" for k, v in s["outcomes"].items() if v)
        lines.append(f"| {LABELS[name]} | {s['pass_at_1']:.0%} ({low:.0%}-{high:.0%}) | "
                     f"{s['n_passed']} / {s['n_scored']} | {greedy_text} | {tools} | "
                     f"{quit_rate} | {outcomes} |")
    return "\n".join(lines)


def _along(results: Mapping[str, Any], arm: str, field: str) -> tuple[list[int], list[Any]]:
    """An arm's figure along its run: SFT at step 0, then each evaluated point."""
    evals = results["stages"].get("eval", {})
    xs, ys = [], []
    if "sft" in evals:
        xs.append(0)
        ys.append(evals["sft"].get(field))
    for point in evals.get(arm, {}).get("points") or []:
        xs.append(point["step"])
        ys.append(point.get(field))
    if arm in evals and not evals[arm].get("points"):  # a results file from before points
        xs.append(results["stages"].get(arm, {}).get("optimizer_steps", 1))
        ys.append(evals[arm].get(field))
    return xs, ys


def plot_learning_curve(results: Mapping[str, Any], path: str | Path | None = None) -> Any:
    """The figure (matplotlib): held-out pass@1 along each arm's run (SFT at step 0, base as a
    line; 95% intervals), tool calls on solved episodes and the quit rate along the runs, and the
    GRPO rollouts' reward per step. Saved as PNG when `path` is given."""
    import matplotlib

    if path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    evals = results["stages"].get("eval", {})
    fig, (ax_pass, ax_tools, ax_quit, ax_reward) = plt.subplots(1, 4, figsize=(18, 4.2))
    arms = [a for a in CHECKPOINTS[2:] if a in evals]
    for arm in arms or [None]:
        if arm is None:  # no arm evaluated: SFT alone
            break
        xs, ys = _along(results, arm, "pass_at_1")
        _, cis = _along(results, arm, "pass_at_1_ci")
        # interval bounds come back a rounding error past the rate: clamp
        below = [max(0.0, y - ci[0]) for y, ci in zip(ys, cis, strict=True)]
        above = [max(0.0, ci[1] - y) for y, ci in zip(ys, cis, strict=True)]
        ax_pass.errorbar(xs, ys, yerr=[below, above], fmt="o-", capsize=4, label=LABELS[arm])
        for ax, field in ((ax_tools, "tool_calls_solved"), (ax_quit, "quit_rate")):
            xs, ys = _along(results, arm, field)
            kept = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None]
            if kept:
                ax.plot(*zip(*kept, strict=True), "o-", label=LABELS[arm])
    for name, style in (("base", ":"), ("sft", "--")):
        if name in evals:
            ax_pass.axhline(evals[name]["pass_at_1"], ls=style, color="gray", lw=1,
                            label=f"{LABELS[name]} ({evals[name]['pass_at_1']:.0%})")
    ax_pass.set_ylim(0, 1)
    ax_pass.set_xlabel("GRPO step (0 = SFT)")
    ax_pass.set_title("held-out pass@1 (95% CI)")
    ax_pass.legend(fontsize="small")
    ax_tools.set_title("tool calls on solved episodes")
    ax_tools.set_xlabel("GRPO step (0 = SFT)")
    ax_quit.set_title("quit rate (repo left unchanged)")
    ax_quit.set_ylim(-0.02, 1.02)
    ax_quit.set_xlabel("GRPO step (0 = SFT)")
    for ax in (ax_tools, ax_quit):
        if ax.lines:
            ax.legend(fontsize="small")

    lowest = -0.05
    for arm in CHECKPOINTS[2:]:  # each GRPO arm's rollouts
        steps = results["stages"].get(arm, {}).get("steps", [])
        if steps:
            x = [s["step"] for s in steps]
            ax_reward.plot(x, [s["reward_mean"] for s in steps], "o-",
                           label=f"{LABELS[arm]}: mean reward")
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
    which run it is, its plot, its table, the headline summary, the targets as measured and the
    plan. Generated, never edited by hand, so the README cannot drift from the committed figures
    (a test compares them)."""
    config, evals = results["config"], results["stages"].get("eval", {})
    first = next(iter(evals.values()), None)
    samples = config.get("eval_samples")
    heldout = first["n_instances"] if first and "n_instances" in first else (
        first["n_episodes"] if first else config["n_heldout"])
    per = (f" x {samples} samples at temperature {config['grpo_temperature']:g} plus one greedy"
           if samples else "")
    sizes = (f"{config['n_demo_tasks']} demonstration tasks, "
             f"{config['grpo_steps']} GRPO step(s) of {config['grpo_groups_per_step']} group(s) "
             f"of {config['grpo_group_size']}, {heldout} held-out instances{per}")
    lines = [
        f"{README_BEGIN}{name} -->",
        (f"From `benchmarks/results/{name}`: {_MODES.get(results['mode'], results['mode'])}; "
        f"policy `{config['policy']}`, tasks `{config['train_suite']}`, {sizes}."),
        "",
        f"![learning curve](benchmarks/results/{Path(name).with_suffix('.png').name})",
        "",
        results_table(results),
    ]
    pending = results.get("stages_pending")
    if pending:
        lines += ["", ("**In progress**: these figures are the stages finished so far; still to "
                       "run: " + ", ".join(f"`{stage}`" for stage in pending) + ".")]
    calibration = results.get("calibration")
    if calibration:
        low, high = calibration["ci"]
        lines += ["", (f"Calibration of the tier: the SFT policy passes "
                  f"{calibration['sft_train_pass_at_temperature']:.0%} ({low:.0%}-{high:.0%}) of "
                  f"{calibration['episodes']} training episodes at temperature "
                  f"{calibration['temperature']:g} (zone {calibration['zone'][0]:.0%}-"
                  f"{calibration['zone'][1]:.0%}: {'in' if calibration['in_zone'] else 'out'}).")]
    sweep = results["stages"].get("lr-sweep")
    if sweep and sweep.get("runs"):
        lines += ["", "Learning-rate sweep (mean rollout reward after the first step): "
                  + ", ".join(f"{r['learning_rate']:g}: "
                              + ("n/a" if r["score"] is None else f"{r['score']:.3f}")
                              for r in sweep["runs"]) + f"; picked {sweep['pick']:g}."]
    paired = results.get("paired") or {}
    if paired:
        lines += ["", "Paired differences in pass@1 (points, 95% paired bootstrap over instances): "
                  + "; ".join(f"{name} {d['points']:+.1f} ({_fmt(d['ci'])})"
                              for name, d in paired.items()) + "."]
    targets = results.get("targets") or {}
    if targets:
        lines += ["", "Targets as measured: " + ", ".join(
            f"`{k}` = {_fmt(v)}" for k, v in targets.items()) + "."]
    times = results.get("times_total")
    if times:
        spent, beside = "", []
        if times.get("discarded_wall_s"):  # stages run, then removed by a changed configuration
            beside.append(f"the {times['discarded_wall_h']:.2f} h of stages it ran and then "
                          "discarded")
        if times.get("unfinished_wall_s"):  # the sittings so far of stages not finished yet
            beside.append(f"the {times['unfinished_wall_h']:.2f} h so far of stages not "
                          "finished yet")
        if beside:
            spent = (f"; with {' and '.join(beside)}, {times['spent_wall_h']:.2f} h of the "
                     "budget are spent")
        lines += ["", (f"This run took {times['wall_h']:.2f} h of wall time "
                  f"({times['cpu_h']:.2f} CPU h) over its stages{spent}.")]
    plan = results.get("plan") or {}
    if plan.get("expected_s"):
        lines += ["", _plan_sentence(plan)]
    elif plan.get("units_measured"):
        lines += ["", "The calibration is not complete; the units it has measured (wall and CPU "
                  "seconds): " + ", ".join(f"`{k}` = {_fmt(v)}"
                                           for k, v in plan["units_measured"].items()) + "."]
    lines.append(README_END)
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, list):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    return str(value)


def _plan_sentence(plan: Mapping[str, Any]) -> str:
    u, z, hours = plan["units"], plan["sizes"], plan["expected_s"]["total"] / 3600
    evals = u["eval_episode_s"].values()
    budget = plan.get("budget_s", 3 * 3600) / 3600
    grpo_per_step = z["grpo_episodes"] // max(1, z["grpo_steps"])
    if "calib_episode_s" not in u:  # a plan from before the calibration stage
        return (f"The full run's plan, from the calibration's per-unit wall times (episodes up "
                f"to 4 at a time): demo episode {u['demo_episode_s']:.0f} s, SFT row "
                f"{u['sft_row_s']:.0f} s, GRPO episode {u['grpo_episode_s']:.0f} s + "
                f"{u['grpo_row_train_s']:.0f} s of training, held-out episode "
                f"{min(evals):.0f}-{max(evals):.0f} s; {z['demo_tasks']} demos, "
                f"{z['sft_epochs']:g} SFT epochs, {z['grpo_steps']} GRPO steps of "
                f"{grpo_per_step} episodes, {z['heldout']} held-out instances per checkpoint: "
                f"{hours:.1f} h expected.")
    level = (u.get("eval_concurrency") or {}).get("full")
    at = f" ({level} at a time)" if level and u["eval_concurrency"].get("throughput") else ""
    cpu = plan.get("expected_wall_s_all_cores")
    on_cores = (f" ({cpu / 3600:.1f} h from its CPU seconds over all cores)"
                if cpu is not None and at else "")
    return (f"The full run's plan, from the calibration's per-unit wall times: demo episode "
            f"{u['demo_episode_s']:.0f} s, SFT row {u['sft_row_s']:.0f} s, GRPO episode "
            f"{u['grpo_episode_s']:.0f} s + {u['grpo_row_train_s']:.0f} s of training, "
            f"held-out episode {min(evals):.0f}-{max(evals):.0f} s{at}, vLLM start "
            f"{u['vllm_startup_s']:.0f} s; {z['demo_tasks']} demos, {z['sft_epochs']:g} SFT "
            f"epochs, {z['sweep_episodes']} sweep episodes, {z['grpo_steps']} GRPO steps of "
            f"{grpo_per_step // max(1, z.get('arms', 1))} episodes per "
            f"arm, {z['points_per_arm']} point(s) per arm, {z['eval_episodes_per_checkpoint']} "
            f"held-out episodes per checkpoint: {hours:.1f} h expected of a {budget:.0f} h "
            f"budget{on_cores}.")


def replace_readme_block(readme: str, block: str) -> str:
    """`readme` with its learning-curve block replaced by `block`."""
    begin = readme.index(README_BEGIN)
    end = readme.index(README_END, begin) + len(README_END)
    return readme[:begin] + block + readme[end:]
