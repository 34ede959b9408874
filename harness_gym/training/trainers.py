"""TRL trainers whose loss runs through `FrozenPrefixScorer`: the prompt without gradient, computed
once per weight version and shared by the rows that start with it (see `frozen_prefix` for the
exact gradient). Imports TRL: load it only where TRL is installed.

`FrozenPrefixSFTTrainer` is what `harness_gym.training.sft.sft_trainer(..., frozen_prefix=True)`
builds.
`FrozenPrefixGRPOTrainer` is a drop-in `GRPOTrainer` for `make_rollout_func` rows, whose prompt
is a Pi episode's first request (~1.6k tokens) and whose completion is the rest of the segment.
Unlike TRL's, its logprobs honour the rollouts' `top_p` and `top_k` (TRL's own divide by the
temperature only): a token drawn from a nucleus is scored under the nucleus, renormalised over
the tokens it kept, exactly as the engines sampled and reported it (`engines/_sampling.py`), so
the policy gradient is that of the distribution that drew the rollouts. A sampled token the
trainer's weights leave outside that set (a server's rounding) cannot be scored so: it adds
no gradient and is counted (`tokens_outside_kept`), never scored under a guess.
"""

from __future__ import annotations

from typing import Any

import torch
from trl import GRPOTrainer, SFTTrainer

from .frozen_prefix import FrozenPrefixScorer

__all__ = ["FrozenPrefixGRPOTrainer", "FrozenPrefixSFTTrainer"]

IGNORE_INDEX = -100


class _FrozenPrefixMixin:
    """One `FrozenPrefixScorer` per model object the trainer scores with, their cached prefixes
    forgotten at every checkpoint load.

    An optimizer step retires them through the cache's own fingerprint (the parameters' version
    counters plus the optimizer steps taken: `engines.prefix_cache`), which also covers torch's
    fused AdamW, transformers 5's default, that updates weights without bumping the counters
    (before that, every step after the first scored on prefix keys and values of the weights
    before it: a held-out loss of 8.29 reported where the model's own was 8.93 after two steps
    of the tiny model). A load may replace the parameters with new tensors, whose counters
    start again: the cache is cleared there."""

    _scorers: dict[int, FrozenPrefixScorer]

    def _forget_prefixes(self) -> None:
        for scorer in self.__dict__.get("_scorers", {}).values():
            scorer.cache.clear()

    def _load_from_checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super()._load_from_checkpoint(*args, **kwargs)  # type: ignore[misc]
        finally:
            self._forget_prefixes()

    def _load_best_model(self) -> Any:
        try:
            return super()._load_best_model()  # type: ignore[misc]
        finally:
            self._forget_prefixes()

    def _scorer(self, model: Any) -> FrozenPrefixScorer:
        model = getattr(self, "accelerator").unwrap_model(model)
        # A peft model's forward takes no KV cache by name (its **kwargs would swallow it
        # unused); the model inside it carries the LoRA layers and takes one.
        model = model.get_base_model() if hasattr(model, "get_base_model") else model
        scorers = self.__dict__.setdefault("_scorers", {})
        scorer = scorers.get(id(model))
        if scorer is None or scorer.model is not model:
            scorer = scorers[id(model)] = FrozenPrefixScorer(model)
        return scorer

    def frozen_prefix_stats(self) -> dict[str, int]:
        """Positions run without gradient (prefix cache misses) and with it, all models."""
        scorers = self.__dict__.get("_scorers", {}).values()
        return {"frozen_tokens": sum(s.frozen_tokens for s in scorers),
                "grad_tokens": sum(s.grad_tokens for s in scorers),
                "reused_tokens": sum(s.cache.stats.reused_tokens for s in scorers),
                "tokens_outside_kept": self.__dict__.get("_outside_kept", 0)}


def _rows(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> list[torch.Tensor]:
    """Each row's real tokens (padding on either side removed)."""
    if attention_mask is None:
        return list(input_ids)
    return [ids[mask.bool()] for ids, mask in zip(input_ids, attention_mask, strict=True)]


class FrozenPrefixSFTTrainer(_FrozenPrefixMixin, SFTTrainer):
    """`SFTTrainer` whose loss is the same masked mean NLL, computed row by row from the first
    labelled position on, with everything before it frozen (`frozen_prefix`)."""

    def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        if return_outputs:
            raise ValueError("FrozenPrefixSFTTrainer computes no model outputs to return")
        scorer = self._scorer(model)
        mask = inputs.get("attention_mask")
        total = torch.zeros((), device=inputs["input_ids"].device)
        count = 0
        rows = zip(_rows(inputs["input_ids"], mask), _rows(inputs["labels"], mask), strict=True)
        for ids, labels in rows:
            labelled = (labels[1:] != IGNORE_INDEX).nonzero()
            if labelled.numel() == 0:
                continue
            start = int(labelled[0]) + 1  # position 0 is never predicted
            logps, _ = scorer.token_logprobs(ids.tolist(), start)
            keep = labels[start:] != IGNORE_INDEX
            total = total - logps[keep].sum()
            count += int(keep.sum())
        denominator = count if num_items_in_batch is None else num_items_in_batch
        loss = total / torch.as_tensor(denominator, device=total.device).clamp(min=1)
        mode = "train" if self.model.training else "eval"
        self._metrics[mode]["loss_tokens"].append(float(count))
        return loss

    def prediction_step(self, model: Any, inputs: dict[str, Any], prediction_loss_only: bool,
                        ignore_keys: list[str] | None = None) -> tuple[Any, None, None]:
        """The validation loss alone (the same masked NLL; no logits are kept)."""
        with torch.no_grad():
            loss = self.compute_loss(model, self._prepare_inputs(inputs))
        return loss.detach(), None, None


class FrozenPrefixGRPOTrainer(_FrozenPrefixMixin, GRPOTrainer):
    """`GRPOTrainer` whose per-token logprobs (the policy's, TRL's re-computed "old" ones, the
    reference model's) come from `FrozenPrefixScorer`: each row's prompt is frozen and shared,
    its completion runs with gradient. Text-only models.

    A row none of whose tokens the model sampled counts nowhere (TRL's loss and metrics take
    `completion_mask * tool_mask`): a group dynamic sampling left out of the loss
    (`integrations.dynamic_sampling`) is not scored at all. Measured in the calibration: one
    such group of 4 rows cost 146 s of a step's training on two cores."""

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Any:
        self._sampled_mask = inputs.get("tool_mask")  # env_mask: 1 where the model sampled
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self._sampled_mask = None

    def _get_per_token_logps_and_entropies(
        self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
        logits_to_keep: int, batch_size: int | None = None, compute_entropy: bool = False,
        compute_aux_loss: bool = False, **multimodal: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        if any(value is not None for value in multimodal.values()) or compute_aux_loss:
            raise ValueError("FrozenPrefixGRPOTrainer scores text-only, dense models")
        scorer = self._scorer(model)
        rows = len(input_ids)
        logps = torch.zeros(rows, logits_to_keep, device=input_ids.device)
        entropies = torch.zeros_like(logps) if compute_entropy else None
        completion_lengths = attention_mask[:, -logits_to_keep:].sum(dim=1).tolist()
        # TRL left-pads prompts and right-pads completions: a row's real tokens are its prompt
        # then its first `n` completion tokens.
        sampled = self.__dict__.get("_sampled_mask")  # inserted tokens: not sampled
        for row, (ids, n) in enumerate(zip(_rows(input_ids, attention_mask), completion_lengths,
                                           strict=True)):
            if n == 0 or (sampled is not None and not sampled[row, :n].any()):
                continue
            picked, entropy = scorer.token_logprobs(
                ids.tolist(), len(ids) - n, temperature=self.temperature, top_p=self.top_p,
                top_k=self.top_k or 0, entropy=compute_entropy,
                scored=None if sampled is None else sampled[row, :n])
            outside = ~picked.isfinite()
            if outside.any():  # see the module docstring
                counted = outside if sampled is None else outside & sampled[row, :n].bool()
                self._outside_kept = self.__dict__.get("_outside_kept", 0) + int(counted.sum())
                picked = torch.where(outside, torch.zeros_like(picked), picked)
            logps[row, :n] = picked
            if entropies is not None and entropy is not None:
                entropies[row, :n] = entropy
        if not logps.requires_grad and torch.is_grad_enabled():
            # nothing scored (every row out of the loss): a zero gradient for every trainable
            # weight, as scoring the rows and masking them all would give
            logps = logps + 0.0 * sum(p.sum() for p in model.parameters() if p.requires_grad)
        return logps, entropies, None
