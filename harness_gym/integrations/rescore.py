"""Re-scoring a sample under the distribution that drew it, call by call.

The importance ratio `exp(logp - p_old)` is only unbiased when `logp` is of the same
distribution as p_old: the engine reports the logprob of the temperature-scaled,
top-k/top-p-filtered distribution it sampled from (`engines/_sampling.py`), and each call of a
segment may have been sampled differently (a session's overrides, a harness's own settings).
So every trace segment records each call's sampling (`sampling_*`, `call_starts`), a sample
keeps it as `CallSpan`s over its tokens, and the trainer re-scores each call's tokens with the
sampler's own `processed_logprobs` under that call's sampling: temperature, top-k and top-p are
reproduced exactly, and mixed samplings within one sample are each scored as drawn.

What cannot be re-scored exactly is refused with `UnscorableSample`, never scored under a
guess: a sampled token whose call left no record of its sampling (a bridge driven without a
sampler, a file older than the record), or a sample that carries no spans at all (one not made
by `segment_samples`). Refused, not dropped: every sample of such a run lacks the record alike,
and dropping them all would leave the trainer waiting on an empty queue.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..engines._sampling import processed_logprobs

__all__ = ["CallSpan", "UnscorableSample", "call_spans", "rescored_logprobs"]


class UnscorableSample(ValueError):
    """A sample whose tokens cannot be re-scored under the distribution that drew them."""


@dataclass(frozen=True)
class CallSpan:
    """Tokens `[start, end)` of a sample's `input_ids` (one call's inserted, then sampled
    tokens), sampled with `temperature`, `top_p`, `top_k` (0: no top-k)."""

    start: int
    end: int
    temperature: float
    top_p: float = 1.0
    top_k: int = 0


def call_spans(segment: Mapping[str, Any]) -> tuple[CallSpan, ...]:
    """The spans of an exported segment's calls, as offsets into prompt + response. Raises
    `UnscorableSample` where a call with sampled tokens has no recorded sampling."""
    offset = len(segment["prompt_ids"])
    mask = segment["loss_mask"]
    n_calls = max(len(segment.get("call_starts") or []), 1)
    starts = list(segment.get("call_starts") or [None])
    temperatures = _per_call(segment, "sampling_temperature", n_calls)
    top_ps = _per_call(segment, "sampling_top_p", n_calls)
    top_ks = _per_call(segment, "sampling_top_k", n_calls)
    spans = []
    for i, start in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else len(mask)
        if start is None or end is None:
            raise UnscorableSample(f"call {i} of the segment records no offset (call_starts): "
                                   "its tokens cannot be matched to the sampling that drew them")
        sampled = any(mask[start:end])
        if temperatures[i] is None:
            if sampled:
                raise UnscorableSample(
                    f"call {i} of the segment sampled {sum(mask[start:end])} tokens but records "
                    "no sampling (temperature, top-p, top-k): they cannot be re-scored under "
                    "the distribution that drew them (was the proxy's bridge driven without a "
                    "sampler?)")
            continue  # inserted tokens only: outside the loss, scored at T=1 (masked out)
        spans.append(CallSpan(offset + start, offset + end, float(temperatures[i]),
                              float(1.0 if top_ps[i] is None else top_ps[i]),
                              int(top_ks[i] or 0)))
    return tuple(spans)


def rescored_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, spans: Sequence[CallSpan], first: int
) -> torch.Tensor:
    """Log-probabilities of `targets` (1-D: the sample's tokens from position `first` on)
    from `logits` (`[len(targets), vocab]`, row i predicting `targets[i]`), each token under
    its call's sampling; tokens in no span (inserted only) under T=1. Differentiable."""
    pieces = []
    at = first
    end = first + targets.shape[0]
    for span in [s for s in spans if s.end > first]:
        if span.start > at:  # a gap: inserted tokens only (their call recorded nothing)
            pieces.append(_plain(logits, targets, at - first, span.start - first))
        lo, hi = max(span.start, at) - first, span.end - first
        logps = processed_logprobs(logits[lo:hi], span)  # type: ignore[arg-type]
        pieces.append(logps.gather(-1, targets[lo:hi, None])[:, 0])
        at = span.end
    if at < end:
        pieces.append(_plain(logits, targets, at - first, end - first))
    return torch.cat(pieces)


def _plain(logits: torch.Tensor, targets: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    logps = torch.log_softmax(logits[lo:hi].float(), dim=-1)
    return logps.gather(-1, targets[lo:hi, None])[:, 0]


def _per_call(segment: Mapping[str, Any], name: str, n_calls: int) -> list[Any]:
    values = list(segment.get(name) or [])
    return values + [None] * (n_calls - len(values))
