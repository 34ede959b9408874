"""The learning curve's configuration: its fields, the presets, the GRPO arms and the stages."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    # Model calls per policy episode (`EpisodeConfig.max_model_calls`); 0: no limit. A policy
    # that loops runs to it and is graded as it stands, instead of running to the timeout.
    max_model_calls: int = 0
    max_tokens: int = 24  # per model call of the policy
    demo_max_tokens: int = 1024  # per model call of the teacher (its turns are never cut)
    # SFT
    sft_epochs: float = 1.0
    sft_learning_rate: float = 1e-3
    sft_grad_accum: int = 1
    sft_max_length: int = 8192
    sft_save_steps: int = 5  # optimizer steps between resumable checkpoints
    # validation: this fraction of the passing demonstrations (whole episodes, drawn by `seed`)
    # is held out, its loss measured at every checkpoint, and SFT ends with the checkpoint of
    # the lowest (after `sft_patience` checkpoints without a new lowest it stops); 0: none
    sft_val_fraction: float = 0.0
    sft_patience: int = 0
    # LoRA: 0 is full fine-tuning; else SFT trains an adapter of this rank and GRPO goes on
    # training it, so every checkpoint is an adapter (a few MB, what a --state folder can keep)
    # and the vLLM server gets the merged weights (harness_gym.training.lora)
    lora_rank: int = 0
    lora_alpha: float = 0.0  # the update's scale is alpha / rank; 0: 2 x rank
    lora_targets: str = "q_proj,v_proj"  # comma-separated module names
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
    # the rollout sampling: GRPO's groups, the train-pass calibration and the evaluation's
    # samples alike (greedy episodes ignore it); every trace records it per call, and the GRPO
    # trainer scores its rollouts under it (the nucleus renormalised, as the engines sample)
    grpo_temperature: float = 1.0
    grpo_top_p: float = 1.0  # 1: the whole vocabulary
    grpo_top_k: int = 0  # 0: no top-k
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
    # metrics (two GRPO steps per arm, so each arm has a point along its run), through LoRA
    # and the nucleus as the full run trains and samples, with the fewest episodes that still
    # give every metric (groups of 2, one held-out instance and one calibration task, one
    # sample each; 3 demonstrations, one held out and measured at each of SFT's 2 checkpoints:
    # its tests take their counts from here).
    "quick": CurveConfig(mode="quick", policy="tiny-vllm", teacher="teacher:tiny,score=0",
                         vllm_kv_cache_gib=1, n_demo_tasks=3, n_heldout=1, sft_save_steps=1,
                         sft_val_fraction=0.34, lora_rank=4, n_calib_tasks=1, calib_samples=1,
                         lr_sweep="1e-4,1e-3", lr_sweep_steps=1, grpo_learning_rate=0.0,
                         grpo_steps=2, grpo_group_size=2, grpo_top_p=0.95, grpo_top_k=50,
                         grpo_eval_every=1, grpo_arms="gated,nopenalty,flat",
                         grpo_dynamic_draws=1, eval_samples=1),
    # SmolLM2 with a handful of each unit: the per-unit times that size the full run.
    # (Half an SFT epoch, one arm, one swept rate, one step each: the arms cost alike per
    # episode; it times the units on a machine shared by six, the full run calibrates the tier.)
    "calibrate": CurveConfig(
        mode="calibrate", policy="smollm2", teacher="teacher:smollm2,churn=0.6",
        n_demo_tasks=8, n_heldout=2, max_tokens=192, episode_timeout_s=600, sft_epochs=0.5,
        sft_learning_rate=5e-4, lora_rank=8, n_calib_tasks=4, calib_samples=2, lr_sweep="1e-4",
        lr_sweep_steps=1, grpo_learning_rate=0.0, grpo_steps=1, grpo_temperature=0.8,
        grpo_arms="gated", grpo_dynamic_draws=1, eval_samples=2),
    # The full run at the floors: 30 GRPO steps per arm of one group of 4 (dynamic
    # sampling refills up to 2 more), 50 held-out instances x 4 samples plus greedy per
    # checkpoint, one point mid-run per arm (1 sample plus greedy). Its plan from the
    # calibration (`plan`): 44.7k s, 8.7k s over the 10 h on the calibration's wall units
    # (measured on a machine shared by six; GRPO's training unit from first steps only; GRPO
    # alone is 22.6k s at the floors), 4.8 h on its CPU seconds over two cores. SFT holds out
    # 10% of the demonstrations and keeps the checkpoint of their lowest loss (the 2-epoch SFT
    # without it memorised its 100 demos, training loss 0.09); rollouts sample T=0.8 within
    # top_p 0.95 and top_k 50 (at the full
    # vocabulary the 135M policy drew 5 of 16 first tokens from the tail, logprobs -3.6 to
    # -10.4, and its episodes degenerated). LoRA rank 8 on every linear layer (attention and
    # MLP; a 9.8 MB adapter), so the run's state is committed between sittings (`--state`); its
    # learning rates are LoRA's (about 5x full fine-tuning's: an adapter's update is low-rank).
    # On the attention's q and v alone, 2 epochs left the policy giving the demos' first token
    # 9% (NLL 2.1; 0.36 for later calls' first tokens): 0 of 24 rollouts passed, 10 ended at
    # their first call without a tool call. Overfitting one demo for 12 steps, all-linear took
    # its loss from 1.05 to 0.16 where q,v reached 0.62, at the same time per step.
    # Rollouts stop at 20 model calls (the teacher's demos take 5 to 7; looping SFT episodes
    # ran 65 to 89 calls, to 880 s).
    "full": CurveConfig(
        mode="full", policy="smollm2", teacher="teacher:smollm2,churn=0.6", n_demo_tasks=100,
        vllm_kv_cache_gib=3,
        n_heldout=50, max_tokens=192, episode_timeout_s=900,
        max_model_calls=20,
        sft_epochs=3, sft_learning_rate=5e-4, sft_grad_accum=4, sft_save_steps=3,
        sft_val_fraction=0.1, sft_patience=2, lora_rank=8,
        lora_targets="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
        n_calib_tasks=24, calib_samples=2, lr_sweep="2e-5,1e-4", lr_sweep_steps=2,
        grpo_learning_rate=0.0, grpo_steps=30, grpo_group_size=4, grpo_groups_per_step=1,
        grpo_temperature=0.8, grpo_top_p=0.95, grpo_top_k=50, grpo_eval_every=15,
        tool_penalty=0.05, grpo_arms="gated,nopenalty,flat", grpo_dynamic_draws=2,
        eval_samples=4, point_samples=1),
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


# The first stage each field changes (a field not named here changes the demonstrations, so
# every stage). A recorded run whose configuration differs goes on under the new one only where
# no stage from the first changed one on has begun (`stale_stages`): each stage starts from what
# the ones before it left, so a change makes every later stage stale too.
FIELD_STAGE = {
    **dict.fromkeys(("policy", "sft_epochs", "sft_learning_rate", "sft_grad_accum",
                     "sft_max_length", "sft_save_steps", "sft_val_fraction", "sft_patience",
                     "lora_rank", "lora_alpha", "lora_targets"), "sft"),
    **dict.fromkeys(("engine", "vllm_max_model_len", "vllm_kv_cache_gib", "max_tokens",
                     "n_calib_tasks", "calib_samples", "grpo_temperature", "grpo_top_p",
                     "grpo_top_k", "max_model_calls"), "train-pass"),
    **dict.fromkeys(("task_kinds", "lr_sweep", "lr_sweep_steps", "grpo_group_size",
                     "grpo_groups_per_step", "grpo_save_steps", "grpo_dynamic_draws"),
                    "lr-sweep"),
    **dict.fromkeys(("grpo_steps", "grpo_learning_rate", "grpo_eval_every", "grpo_arms"),
                    ARMS["gated"]),
    **dict.fromkeys(("heldout_suite", "n_heldout", "eval_samples", "point_samples"),
                    "eval-base"),
}


def stale_stages(fields: list[str]) -> list[str]:
    """The stages a change of `fields` makes stale: from the first stage any of them changes
    (`FIELD_STAGE`) on, in `STAGES` order."""
    if not fields:
        return []
    first = min(STAGES.index(FIELD_STAGE.get(name, "demos")) for name in fields)
    return list(STAGES[first:])


def config_differences(mine: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    """The fields in which two recorded configurations differ (a field added since one was
    recorded counts at its default)."""
    defaults = {f.name: f.default for f in dataclasses.fields(CurveConfig)}
    return sorted(k for k in mine.keys() | theirs.keys()
                  if mine.get(k, defaults.get(k)) != theirs.get(k, defaults.get(k)))


def recorded_differences(folder: Path, config: dict[str, Any]) -> list[str] | None:
    """The fields in which `config` differs from the one recorded in `folder`'s config.json
    (see `config_differences`), or None where the folder records none."""
    recorded = folder / "config.json"
    if not recorded.is_file():
        return None
    return config_differences(config, json.loads(recorded.read_text()))


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
