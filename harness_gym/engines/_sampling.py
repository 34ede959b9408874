"""Turning one position's logits into a sampled token and its processed logprob.

The logprob reported is the one the trainer's importance ratio needs (p_old): the probability of
the token under the distribution it was actually drawn from, i.e. after temperature, top-k and
top-p, renormalised, as vLLM reports with `--logprobs-mode processed_logprobs`. Greedy decoding
draws from no distribution, so it reports the raw (T=1) logprob. Everything runs in float32 on
the CPU: the vector is one row of the vocabulary, and a CPU `torch.Generator` gives the same
tokens for the same seed whatever device the model runs on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .base import SamplingParams

if TYPE_CHECKING:
    from ..trace import CallSampling


def processed_logprobs(logits: torch.Tensor, sampling: SamplingParams | CallSampling
                       ) -> torch.Tensor:
    """Log-probabilities (float32, over the last dimension) of the distribution `sampling`
    draws from. The trainer re-scores with this same function (`integrations/rescore.py`), so
    its logprobs are the sampler's by construction; it is differentiable in `logits`."""
    scores = logits.float()
    if sampling.temperature == 0:
        return torch.log_softmax(scores, dim=-1)
    scores = scores / sampling.temperature
    vocab = scores.shape[-1]
    if 0 < sampling.top_k < vocab:
        kth_best = torch.topk(scores, sampling.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth_best, float("-inf"))
    if sampling.top_p < 1.0:
        # vLLM's rule: drop the least likely tokens whose total mass stays within 1 - top_p,
        # always keeping the most likely one.
        ascending, order = torch.sort(scores, dim=-1)
        cumulative = torch.softmax(ascending, dim=-1).cumsum(dim=-1)
        drop = cumulative <= 1.0 - sampling.top_p
        drop[..., -1] = False
        scores = scores.scatter(-1, order, ascending.masked_fill(drop, float("-inf")))
    return torch.log_softmax(scores, dim=-1)


def sample_token(
    logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator
) -> tuple[int, float]:
    """Pick the next token from one position's logits; return it with its processed logprob."""
    logprobs = processed_logprobs(logits, sampling)
    if sampling.temperature == 0:
        token = int(torch.argmax(logprobs))
    else:
        token = int(torch.multinomial(logprobs.exp(), 1, generator=generator))
    return token, float(logprobs[token])
