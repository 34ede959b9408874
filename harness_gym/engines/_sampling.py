"""Turning one position's logits into a sampled token and its processed logprob.

The logprob reported is the one the trainer's importance ratio needs (p_old): the probability of
the token under the distribution it was actually drawn from, i.e. after temperature, top-k and
top-p, renormalised, as vLLM reports with `--logprobs-mode processed_logprobs`. Greedy decoding
draws from no distribution, so it reports the raw (T=1) logprob. Everything runs in float32 on
the CPU: the vector is one row of the vocabulary, and a CPU `torch.Generator` gives the same
tokens for the same seed whatever device the model runs on.
"""

from __future__ import annotations

import torch

from .base import SamplingParams


def processed_logprobs(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """Log-probabilities (1-D, float32) of the distribution `sampling` draws from."""
    scores = logits.float()
    if sampling.temperature == 0:
        return torch.log_softmax(scores, dim=-1)
    scores = scores / sampling.temperature
    vocab = scores.shape[-1]
    if 0 < sampling.top_k < vocab:
        kth_best = torch.topk(scores, sampling.top_k).values[-1]
        scores = scores.masked_fill(scores < kth_best, float("-inf"))
    if sampling.top_p < 1.0:
        # vLLM's rule: drop the least likely tokens whose total mass stays within 1 - top_p,
        # always keeping the most likely one.
        ascending, order = torch.sort(scores)
        cumulative = torch.softmax(ascending, dim=-1).cumsum(dim=-1)
        drop = cumulative <= 1.0 - sampling.top_p
        drop[-1] = False
        scores = scores.scatter(0, order, ascending.masked_fill(drop, float("-inf")))
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
