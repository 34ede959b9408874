"""Warm start from traces: supervised fine-tuning on the exact tokens a CLI exchanged.

    from harness_gym.training.sft import load_episodes, sft_rows, train_sft

    episodes = load_episodes("runs/")              # RecordTraces / `harness-gym run` files
    rows = sft_rows(episodes)                      # passing episodes' agent segments
    trainer = train_sft(model, tokenizer, rows, output_dir="ckpt/sft")
    masked_nll(trainer.model, rows)                # mean loss per trained token

`sft_trainer` builds the same trainer untrained, for callers that add callbacks or subclass it.

Held-out validation: `validation_split(rows, fraction, seed)` sets whole demonstrations aside
(every row of an episode on one side), and `sft_trainer(..., eval_rows=held_out, patience=k)`
measures their masked loss at every checkpoint and ends with the checkpoint of the lowest one
(transformers' `load_best_model_at_end`, `EarlyStoppingCallback` after k evaluations without a
new best). Why: a 135M policy trained on its 100 demonstrations to a training loss of 0.09
(2 epochs) memorised them, and gave P("Let") of only exp(-0.44)..exp(-1.39) as the first token
of unseen tasks' answers; the training loss alone cannot say when that starts.

A row is one trace segment as it was recorded: `input_ids = prompt_ids + response_ids` and
`labels` equal to `input_ids` where the segment's `loss_mask` is 1 and -100 elsewhere (the
prompt, and the tool results and user turns the proxy inserted between calls). Nothing is
re-rendered or re-tokenized: the model learns the ids it will see and emit through the proxy,
including the template's tool-call format and the CLI's own re-serialized history, which a
re-rendering of the conversation's text would not reproduce (see docs/design.md,
"2. The append-only token bridge").

Training uses TRL's `SFTTrainer`. TRL 1.16 takes pre-tokenized rows: a dataset with an
`input_ids` column is treated as processed (no template, no tokenizer call), a `labels` column
is used as it is, and its collator pads `labels` with -100; the loss is the mean negative
log-likelihood over positions whose label is not -100 (`SFTTrainer.compute_loss`). We pass
`labels` rather than `assistant_masks` so the masking is explicit in the data and survives
`skip_prepare_dataset`. Defaults differ from TRL's where they would hurt here: `max_length=None`
(TRL's 1024 would cut a ~2k-token Pi episode down to its prompt, then drop it as fully masked),
float32 (no bf16 on CPU), no gradient checkpointing (small models), no checkpoints saved unless
asked. The gradient is that of full fine-tuning on the masked tokens; with `frozen_prefix=True`
each row's prompt (everything before its first loss token) runs once without gradient and is
shared between rows, which makes a Pi row ~3x cheaper on a CPU and changes the gradient as
`harness_gym.training.frozen_prefix` says.

By default only `passed` episodes and `agent` segments are kept (`outcomes=None` keeps every
episode). Sources: lists of `info` dicts (each with `trace`, `outcome`, `task_id`), `RecordTraces`
JSONL or Parquet files, `harness-gym run` JSONL files, or a directory of them.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .lora import LoraSpec

__all__ = [
    "IGNORE_INDEX",
    "TraceFormatError",
    "load_episodes",
    "masked_nll",
    "segment_row",
    "sft_config",
    "sft_dataset",
    "sft_rows",
    "sft_trainer",
    "train_sft",
    "turn_opening_nll",
    "validation_split",
]

log = logging.getLogger(__name__)

IGNORE_INDEX = -100  # the label that carries no loss (PyTorch's cross-entropy convention)
EpisodeSource = str | os.PathLike[str] | Iterable[Mapping[str, Any]]


class TraceFormatError(ValueError):
    """A trace segment is not what the proxy records (mismatched lengths, a mask not 0/1)."""


def load_episodes(source: EpisodeSource) -> list[dict[str, Any]]:
    """Episodes (dicts with `trace`, `outcome`, `task_id`, ...) from a file, a directory of
    `.jsonl`/`.parquet` files, or an iterable of `info` dicts (returned as they are)."""
    if not isinstance(source, (str, os.PathLike)):
        return [dict(episode) for episode in source]
    path = Path(source)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in (".jsonl", ".parquet"))
        if not files:
            raise FileNotFoundError(f"{path} holds no .jsonl or .parquet trace files")
        return [episode for file in files for episode in load_episodes(file)]
    if path.suffix == ".parquet":
        import pyarrow.parquet as parquet

        return parquet.read_table(path).to_pylist()
    if path.suffix == ".jsonl":
        with path.open(encoding="utf-8") as lines:
            return [json.loads(line) for line in lines if line.strip()]
    raise ValueError(f"{path}: trace files are .jsonl or .parquet (RecordTraces, harness-gym run)")


def segment_row(segment: Mapping[str, Any]) -> dict[str, list[int]]:
    """One segment as a training row: its exact ids, labels masked by its `loss_mask`."""
    prompt, response = list(segment["prompt_ids"]), list(segment["response_ids"])
    mask = list(segment["loss_mask"])
    if len(mask) != len(response):
        raise TraceFormatError(
            f"loss_mask has {len(mask)} entries for {len(response)} response tokens: "
            "a segment's mask covers its response tokens one to one"
        )
    if any(bit not in (0, 1) for bit in mask):
        raise TraceFormatError("loss_mask holds values other than 0 and 1")
    labels = [IGNORE_INDEX] * len(prompt)
    labels += [token if bit else IGNORE_INDEX for token, bit in zip(response, mask, strict=True)]
    return {"input_ids": prompt + response, "labels": labels}


def sft_rows(
    episodes: EpisodeSource,
    *,
    outcomes: Sequence[str] | None = ("passed",),
    roles: Sequence[str] = ("agent",),
    max_length: int | None = None,
) -> list[dict[str, Any]]:
    """Training rows from episodes: one per kept segment, with `task_id` and `outcome` beside
    `input_ids` and `labels`. `outcomes=None` keeps every episode. Segments without a single
    loss token, and (with `max_length`) longer segments, are left out (counted in the log):
    a row is never truncated, since a cut row would teach from a prompt it no longer shows."""
    rows: list[dict[str, Any]] = []
    too_long = 0
    for episode in load_episodes(episodes):
        if outcomes is not None and episode.get("outcome") not in outcomes:
            continue
        for index, segment in enumerate(episode.get("trace") or []):
            if segment.get("role") not in roles:
                continue
            row = segment_row(segment)
            if all(label == IGNORE_INDEX for label in row["labels"]):
                continue
            if max_length is not None and len(row["input_ids"]) > max_length:
                too_long += 1
                continue
            rows.append({**row, "task_id": episode.get("task_id"),
                         "outcome": episode.get("outcome"), "segment": index})
    if too_long:
        log.warning("left out %d segment(s) longer than max_length=%d", too_long, max_length)
    return rows


def validation_split(
    rows: Sequence[Mapping[str, Any]], fraction: float, *, seed: int = 0
) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """`rows` (`sft_rows` output) as (training, validation), the validation side holding
    `fraction` of the demonstrations (at least one, at most all but one; whole episodes, drawn
    by `seed`). A demonstration is an episode, told apart by its `task_id`."""
    import random

    if not 0 < fraction < 1:
        raise ValueError(f"a validation fraction is in (0, 1), got {fraction}")
    tasks = sorted({str(row["task_id"]) for row in rows})
    if len(tasks) < 2:
        raise ValueError(f"a validation split needs two demonstrations or more, got {len(tasks)}")
    count = min(len(tasks) - 1, max(1, round(fraction * len(tasks))))
    held_out = set(random.Random(seed).sample(tasks, count))
    training = [row for row in rows if str(row["task_id"]) not in held_out]
    validation = [row for row in rows if str(row["task_id"]) in held_out]
    return training, validation


def sft_dataset(episodes: EpisodeSource | list[dict[str, Any]], **filters: Any) -> Any:
    """`sft_rows` as a `datasets.Dataset` (columns `input_ids`, `labels`, `task_id`, ...).
    Rows already made by `sft_rows` are taken as they are."""
    from datasets import Dataset

    rows = episodes if _are_rows(episodes) else sft_rows(episodes, **filters)
    if not rows:
        raise ValueError("no training rows: no episode passed the filters (outcomes, roles)")
    return Dataset.from_list(rows)


def sft_config(output_dir: str | os.PathLike[str], **overrides: Any) -> Any:
    """A TRL `SFTConfig` with this module's defaults (see the module docstring)."""
    from trl import SFTConfig

    settings: dict[str, Any] = {
        "output_dir": str(output_dir),
        "max_length": None,
        "bf16": False,
        # transformers 5 renamed it; TRL 1.16 still defaults the old name to True
        "activation_checkpointing": overrides.pop("gradient_checkpointing", False),
        "per_device_train_batch_size": 1,
        "num_train_epochs": 1,
        "learning_rate": 5e-5,
        "lr_scheduler_type": "constant",
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": [],
        "dataloader_pin_memory": False,
        "use_cpu": not _has_accelerator(),
    }
    settings.update(overrides)
    return SFTConfig(**settings)


def sft_trainer(
    model: Any,
    tokenizer: Any,
    rows: EpisodeSource | list[dict[str, Any]] | Any,
    *,
    output_dir: str | os.PathLike[str],
    frozen_prefix: bool = False,
    lora: LoraSpec | None = None,
    eval_rows: list[dict[str, Any]] | Any = None,
    patience: int = 0,
    **config: Any,
) -> Any:
    """A TRL `SFTTrainer` for `model` (a causal LM, or a model directory) on `rows` (`sft_rows`
    output, a `datasets.Dataset` of such rows, or episodes), not yet trained. `config`
    overrides `sft_config` fields (`num_train_epochs`, `learning_rate`, `max_steps`, ...).
    `frozen_prefix=True` builds a `FrozenPrefixSFTTrainer`: the same loss, with each row's
    prompt run once without gradient (see `harness_gym.training.frozen_prefix`). With `lora`
    only a new LoRA adapter trains (`harness_gym.training.lora`); `save_model` then writes the
    adapter, and its checkpoints hold the adapter's optimizer state.

    With `eval_rows` (rows as `rows`, e.g. `validation_split`'s second half) their loss is
    measured at every checkpoint (`eval_loss` in `state.log_history`; one batch, so it is the
    mean over all their loss tokens, as `masked_nll`), and training ends with the weights of the
    checkpoint where it was lowest (`state.best_model_checkpoint`); `patience` > 0 stops after
    that many evaluations without a new lowest. Checkpoints are saved every `save_steps` (or
    every epoch when `save_strategy` is not given)."""
    from datasets import Dataset
    from transformers import EarlyStoppingCallback
    from trl import SFTTrainer

    if frozen_prefix:
        from .trainers import FrozenPrefixSFTTrainer as SFTTrainer

    def columns(data: Any) -> Any:
        data = data if isinstance(data, Dataset) else sft_dataset(data)
        return data.select_columns(["input_ids", "labels"])

    dataset = columns(rows)
    held_out = None if eval_rows is None else columns(eval_rows)
    if held_out is not None:
        if config.get("save_strategy", "no") == "no":
            config["save_strategy"] = "epoch"
        config = {"eval_strategy": config["save_strategy"], "eval_steps": config.get("save_steps"),
                  "load_best_model_at_end": True, "metric_for_best_model": "eval_loss",
                  "greater_is_better": False, "per_device_eval_batch_size": len(held_out),
                  **config}
    elif patience:
        raise ValueError("early stopping (patience) needs eval_rows to measure")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return SFTTrainer(
        model=model, args=sft_config(output_dir, **config), train_dataset=dataset,
        eval_dataset=held_out, processing_class=tokenizer,
        peft_config=lora.peft_config() if lora else None,
        callbacks=[EarlyStoppingCallback(patience)] if patience else None,
    )


def train_sft(
    model: Any,
    tokenizer: Any,
    rows: EpisodeSource | list[dict[str, Any]] | Any,
    *,
    output_dir: str | os.PathLike[str],
    frozen_prefix: bool = False,
    lora: LoraSpec | None = None,
    eval_rows: list[dict[str, Any]] | Any = None,
    patience: int = 0,
    **config: Any,
) -> Any:
    """`sft_trainer(...)`, trained; returns the trainer (`trainer.model` is the tuned model,
    the best checkpoint's with `eval_rows`; `trainer.state.log_history` the losses; save with
    `trainer.save_model(path)`)."""
    trainer = sft_trainer(model, tokenizer, rows, output_dir=output_dir,
                          frozen_prefix=frozen_prefix, lora=lora, eval_rows=eval_rows,
                          patience=patience, **config)
    trainer.train()
    return trainer


def masked_nll(model: Any, rows: Sequence[Mapping[str, Any]]) -> float:
    """Mean negative log-likelihood per loss token of `rows` under `model` (one row at a time,
    no gradient): the quantity SFT minimises, for before/after comparisons."""
    total, count = 0.0, 0
    for nll, keep in _row_nlls(model, rows):
        total += float(nll[keep].sum())
        count += int(keep.sum())
    if count == 0:
        raise ValueError("the rows hold no loss tokens")
    return total / count


def turn_opening_nll(model: Any, rows: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """Mean NLL of the first token of each model turn (a run of loss tokens) in `rows`: of the
    episode's first turn (`first_turn`), of its later turns (`later_turns`), and of every other
    loss token (`rest`); None where there is none.

    Why apart: a turn's first token is its decision (call a tool, read, edit, or stop), one
    token among the ~40 of a turn, so the mean loss hides it. Measured on SmolLM2 after 2
    epochs of LoRA on q and v: mean loss 0.11, first turn's first token 2.1 (the demos' opening
    at 12%), and the policy ended 10 of 24 rollouts at that first turn."""
    first: list[float] = []
    later: list[float] = []
    rest: list[float] = []
    for nll, keep in _row_nlls(model, rows):
        opens = keep.clone()
        opens[1:] &= ~keep[:-1]  # a loss token right after a non-loss one
        positions = opens.nonzero().flatten().tolist()
        for k, position in enumerate(positions):
            (first if k == 0 else later).append(float(nll[position]))
        rest.extend(float(x) for x in nll[keep & ~opens])

    def mean(values: list[float]) -> float | None:
        return sum(values) / len(values) if values else None

    return {"first_turn": mean(first), "later_turns": mean(later), "rest": mean(rest)}


def _row_nlls(model: Any, rows: Sequence[Mapping[str, Any]]) -> Iterator[tuple[Any, Any]]:
    """Per row: the NLL of each next token (position t predicts token t + 1) and which of
    them are loss tokens; no gradient, the model in eval mode meanwhile."""
    import torch

    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for row in rows:
                ids = torch.tensor([row["input_ids"]], device=device)
                targets = torch.tensor(row["labels"], device=device)[1:]
                logits = model(input_ids=ids).logits[0, :-1].float()
                keep = targets != IGNORE_INDEX
                nll = torch.nn.functional.cross_entropy(
                    logits, targets.clamp(min=0), reduction="none")
                yield nll, keep
    finally:
        model.train(was_training)


def _are_rows(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and "labels" in value[0]


def _has_accelerator() -> bool:
    import torch

    return torch.cuda.is_available()
