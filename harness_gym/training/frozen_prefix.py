"""Training that spends compute where the loss is: the prompt's activations computed once,
without gradient, and the loss tokens' positions run on top of them.

Why: an agent segment of a Pi episode is ~2,070 SmolLM2 tokens, of which ~1,660 are the first
prompt (system prompt, tool list, task) and ~170 the model's own. A forward+backward+step over
1,024 tokens takes ~8 s on two idle cores and ~31 s over 3,072; a forward alone costs about a
third of a forward+backward. So backpropagating through a prompt that carries no loss is most of
a step, and the same system prompt is recomputed for every row.

What `FrozenPrefixScorer.token_logprobs(ids, start)` computes: log p(ids[t] | ids[:t]) for every
t >= start. The keys and values of positions before `start - 1` (the frozen prefix) come from a
`PrefixKVCache` or a forward under `torch.no_grad()`; positions `start - 1` to the end run with
gradient on top of them (position `start - 1` is the one whose logits predict the first loss
token, so it must be among them). Rows that share a prefix (every episode's system prompt; a
GRPO group's whole prompt) compute it once per weight version: the cache keys entries by a
fingerprint of the weights (their version counters plus the optimizer steps taken, which covers
fused AdamW: `engines.prefix_cache`), so an optimizer step retires them; the trainers
(`trainers`) also clear the cache at every checkpoint load.

The loss value is exactly the full-sequence one (the same forward, split in two). The gradient is
the full-sequence gradient with the frozen prefix's keys and values held constant: it keeps every
path through the positions from `start - 1` on (their own layers, and their queries and the loss
attending over the prefix's keys and values), and drops the paths by which the weights shape the
prefix's keys and values (d loss / d K_prefix * d K_prefix / d theta, the same for V). It is the
exact gradient of "continue this context, whose encoding is given". For SFT on demonstrations
and for GRPO on completions the prompt carries no loss, so this is the part of the gradient that
trains the model to encode the prompt better for its answer, not to answer it. Dropout in the
prefix forward follows `model.training` (SmolLM2 and Qwen2 have none).

Why not packing: on a CPU a forward's cost grows with its tokens, so padding several rows into
one batch or packing them into one sequence saves nothing, while each row still needs its own
prefix; rows run one at a time (gradient accumulation gives larger batches).

Memory: what a row keeps for its backward pass grows with its completion (a multi-turn
episode's completion holds the tool output between its turns). Only the sampled positions get
logits (`scored`), and each layer's MLP is recomputed in the backward pass; a trainer that runs
one row a pass (gradient accumulation) then holds one row's graph at a time
(`benchmarks/grpo_step_memory.py` measures it).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from ..engines._sampling import processed_logprobs
from ..engines.base import SamplingParams
from ..engines.prefix_cache import DEFAULT_MAX_BYTES, PrefixKVCache, cache_kwarg

__all__ = ["FrozenPrefixScorer"]


class FrozenPrefixScorer:
    """Per-token logprobs of a row's loss span with a frozen, shared prefix (module docstring).

    >>> import torch
    >>> from transformers import AutoModelForCausalLM
    >>> from harness_gym.engines.tiny import tiny_model_dir
    >>> model = AutoModelForCausalLM.from_pretrained(tiny_model_dir())
    >>> scorer = FrozenPrefixScorer(model)
    >>> ids = list(range(100, 160))
    >>> logps, _ = scorer.token_logprobs(ids, start=50)      # positions 50..59 carry the loss
    >>> full = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, 49:-1], -1)
    >>> bool(torch.allclose(logps, full.gather(1, torch.tensor(ids[50:])[:, None])[:, 0],
    ...                     atol=1e-5))
    True
    >>> logps.sum().backward()                               # gradient through positions 49..58
    """

    def __init__(self, model: Any, *, cache_bytes: int = DEFAULT_MAX_BYTES,
                 recompute_mlps: bool = True) -> None:
        self.model = model
        self.recompute_mlps = recompute_mlps  # in training (`_recomputed_mlps`)
        self.cache = PrefixKVCache(model, max_bytes=cache_bytes)
        self._kwarg = cache_kwarg(model)
        self.frozen_tokens = 0  # prefix positions run without gradient (cache misses)
        self.grad_tokens = 0  # positions run with gradient

    def token_logprobs(
        self,
        ids: Sequence[int],
        start: int,
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        entropy: bool = False,
        scored: Sequence[bool] | torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """log p(ids[t] | ids[:t]) for t in [start, len(ids)) (1-D, with gradient), and the
        entropy of each of those next-token distributions when asked. Logits are divided by
        `temperature` first (as TRL does when it re-scores samples); with `top_p` < 1 or
        `top_k` > 0 the distribution is the sampler's, renormalised over the tokens it kept
        (`engines._sampling.processed_logprobs`, which the engines sample from), and a token
        outside that set has logprob -inf.

        `scored` (one flag per t) names the positions that carry a loss, the tokens the model
        sampled: the others (a tool's output the harness inserted) still run with gradient, as
        their keys and values feed the later tokens, but get no logits: logprob 0, entropy 0.
        Why: each position's vocabulary-wide tensors are kept for the backward pass (on a GRPO
        step of 4 rows, 4,955 completion tokens of which 1,398 sampled, scoring only the sampled
        ones cut the peak by about a quarter, the loss the same: `grpo_step_memory.json`)."""
        ids = [int(i) for i in ids]
        if not 1 <= start < len(ids):
            raise ValueError(f"start must be in [1, {len(ids)}) for a row of {len(ids)} tokens, "
                             f"got {start}: position 0 has nothing before it to be scored on")
        if getattr(self.model, "is_gradient_checkpointing", False) and self.model.training:
            # transformers turns the KV cache off under checkpointing: the prefix would be lost
            raise ValueError("the frozen prefix needs the KV cache, which gradient checkpointing "
                             "disables: train with activation_checkpointing=False")
        device = self.model.get_input_embeddings().weight.device
        keep = None if scored is None else _scored_positions(scored, len(ids) - start, device)
        frozen = start - 1
        kv, reused = self.cache.restore(ids[: frozen + 1])  # at most `frozen` tokens
        if frozen > reused:
            with torch.no_grad():
                self._forward(ids[reused:frozen], kv, device)
            self.cache.add(ids[:frozen], kv)
            self.frozen_tokens += frozen - reused
        with _recomputed_mlps(self.model) if self.recompute_mlps else nullcontext():
            logits = self._forward(ids[frozen:-1], kv, device, keep).float()
        self.grad_tokens += len(ids) - 1 - frozen
        if top_p < 1.0 or top_k > 0:
            logprobs = processed_logprobs(
                logits, SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k))
        else:
            logprobs = torch.log_softmax(logits / temperature if temperature != 1.0 else logits,
                                         dim=-1)
        targets = torch.tensor(ids[start:], device=logprobs.device)
        if keep is not None:
            targets = targets[keep]
        picked = logprobs.gather(1, targets[:, None])[:, 0]
        entropies = None
        if entropy:
            # with gradient (a bonus may use it); a token the sampler dropped adds nothing
            terms = torch.where(logprobs.isfinite(), logprobs.exp() * logprobs, 0.0)
            entropies = -terms.sum(dim=-1)
        if keep is None:
            return picked, entropies
        return (_spread(picked, keep, len(ids) - start),
                None if entropies is None else _spread(entropies, keep, len(ids) - start))

    def _forward(self, ids: list[int], kv: Any, device: Any,
                 keep: torch.Tensor | None = None) -> torch.Tensor:
        inputs = torch.tensor([ids], dtype=torch.long, device=device)
        positions = {} if keep is None else {"logits_to_keep": keep}
        return self.model(input_ids=inputs, use_cache=True, **{self._kwarg: kv},
                          **positions).logits[0]


@contextmanager
def _recomputed_mlps(model: Any) -> Iterator[None]:
    """Each decoder layer's MLP keeps only its input for the backward pass and runs again in it
    (activation checkpointing). Why: its intermediates are about a third of what a position keeps
    (measured by hand: a row with a 2,626-token completion peaked about a quarter lower, its time
    unchanged on two cores). Only the MLP: attention updates the KV cache, which a second run
    would append to twice. A no-op without gradient, and for models whose layers have no `.mlp`."""
    if not (torch.is_grad_enabled() and model.training):
        yield
        return
    mlps = [m for name, m in model.named_modules() if name.endswith(".mlp")]
    shadowed = [m.__dict__.get("forward") for m in mlps]
    for mlp in mlps:
        mlp.forward = functools.partial(checkpoint, mlp.forward, use_reentrant=False)
    try:
        yield
    finally:
        for mlp, own in zip(mlps, shadowed, strict=True):
            if own is None:
                del mlp.forward
            else:
                mlp.forward = own


def _scored_positions(scored: Sequence[bool] | torch.Tensor, positions: int,
                      device: Any) -> torch.Tensor:
    flags = torch.as_tensor(scored, device=device).flatten()
    if len(flags) != positions:
        raise ValueError(f"scored has {len(flags)} flags for {positions} loss positions")
    return flags.bool().nonzero()[:, 0]


def _spread(values: torch.Tensor, keep: torch.Tensor, positions: int) -> torch.Tensor:
    """`values` (one per kept position) at their places in a row of `positions`, 0 elsewhere."""
    return values.new_zeros(positions).index_put((keep,), values)
