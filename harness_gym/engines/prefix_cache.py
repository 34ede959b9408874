"""`PrefixKVCache`: keys and values a model already computed, reused for a later sequence that
starts with the same token ids.

Why: on a CPU the prompt dominates an agent's cost. Every Pi episode's first request starts with
the same system prompt and tool list (~1.6k SmolLM2 tokens), and every later call of an episode
starts with the previous call's prompt and completion; SmolLM2-135M prefills 2,500 tokens in
~6 s on two idle cores and decodes ~20 tokens/s. Reusing the prefix leaves only the new tokens
(a tool result, the next task statement) to run.

Matching is by token ids (the longest common prefix with any entry), like vLLM's automatic
prefix caching: no hint from the caller is needed, and it works across calls, sessions and
episodes. An entry holds references to the key/value tensors of a finished forward:
`DynamicLayer.update` grows a cache by concatenating into new tensors and never writes into old
ones, so keeping them copies nothing. A restore copies the matched slice into a fresh cache, which
the new request then grows on its own.

Exactness: a cached prefix changes only how the work is split (prefix and rest in two forwards
instead of one), not what is computed; logprobs agree with an uncached run to float rounding
(~1e-6, tests/test_prefix_cache.py), not bit for bit.

Stale weights: an entry is tagged with a fingerprint of the weights: the sum of the parameters'
version counters, which in-place updates bump (`load_state_dict`, `torch.no_grad()` writes, the
foreach and for-loop optimizers), plus the count of optimizer steps taken in this process, since
torch's fused AdamW (transformers 5's default optimizer) writes the weights without bumping their
counters. An entry with another fingerprint is never reused, so KV computed before a training
step is dropped after it. Writes through `param.data` are tracked by neither: code that updates
weights that way must call `clear()`.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

__all__ = ["DEFAULT_MAX_BYTES", "PrefixKVCache", "cache_kwarg", "weights_fingerprint"]

#: Default budget: ~23k tokens of SmolLM2-135M (46 KB of float32 keys and values per token).
DEFAULT_MAX_BYTES = 1 << 30


_optimizer_steps = 0


def _count_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    global _optimizer_steps
    _optimizer_steps += 1


# Any optimizer's step, in this process: conservative (a step of another model's optimizer
# retires these entries too), and the one signal a fused optimizer gives.
register_optimizer_step_post_hook(_count_step)


def weights_fingerprint(model: Any) -> int:
    """A number that grows whenever a parameter is modified in place or an optimizer steps
    (see the module doc)."""
    return sum(p._version for p in model.parameters()) + _optimizer_steps


def cache_kwarg(model: Any) -> str:
    """The name `model.forward` takes a KV cache under: transformers 5.x renamed
    `past_key_values` to `cache`; models of either age are accepted."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


@dataclass(eq=False)
class _Entry:
    ids: np.ndarray
    layers: list[tuple[torch.Tensor, torch.Tensor]]
    nbytes: int
    fingerprint: int


@dataclass
class PrefixCacheStats:
    """Counters since the cache was made: `lookups` (sequences started), `hits` (those that
    reused a prefix), `reused_tokens` (prefix tokens not recomputed), `computed_tokens` (prompt
    tokens run through the model)."""

    lookups: int = 0
    hits: int = 0
    reused_tokens: int = 0
    computed_tokens: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


class PrefixKVCache:
    """Longest-prefix reuse of a model's KV cache, bounded by `max_bytes` (least recently used
    entries go first). Not thread-safe: one owner (the engine's worker thread, or a training
    loop) uses it. `min_tokens`: shorter matches are not worth a restore.

    >>> import torch
    >>> from harness_gym.engines import load_tiny_engine
    >>> model = load_tiny_engine().model
    >>> cache = PrefixKVCache(model)
    >>> with torch.inference_mode():
    ...     kv, start = cache.restore(list(range(40)))      # nothing cached yet: run all 40
    ...     _ = model(input_ids=torch.tensor([list(range(40))]), cache=kv)
    ...     cache.add(list(range(40)), kv)
    ...     kv, start = cache.restore(list(range(30)) + [7, 8])
    >>> start, kv.get_seq_length()                            # 30 tokens reused
    (30, 30)
    """

    def __init__(self, model: Any, *, max_bytes: int = DEFAULT_MAX_BYTES, min_tokens: int = 16):
        self._model = model
        self.max_bytes = int(max_bytes)
        self.min_tokens = max(1, int(min_tokens))
        self._entries: list[_Entry] = []  # least recently used first
        self._bytes = 0
        self.stats = PrefixCacheStats()

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self._model.config)

    def fingerprint(self) -> int:
        return weights_fingerprint(self._model)

    def restore(self, ids: list[int]) -> tuple[DynamicCache, int]:
        """A fresh cache holding the longest cached prefix of `ids` (at most `len(ids) - 1`
        tokens: the last one must run to give the next token's logits), and its length. The
        caller runs `ids[length:]` through the model with it."""
        self.stats.lookups += 1
        fingerprint = self.fingerprint()
        length, entry = self._longest(np.asarray(ids, dtype=np.int64), fingerprint)
        if entry is None or length < self.min_tokens:
            self.stats.computed_tokens += len(ids)
            return self.new_cache(), 0
        self._entries.remove(entry)
        self._entries.append(entry)  # most recently used
        cache = DynamicCache(
            ddp_cache_data=[(k[..., :length, :], v[..., :length, :]) for k, v in entry.layers],
            config=self._model.config)
        self.stats.hits += 1
        self.stats.reused_tokens += length
        self.stats.computed_tokens += len(ids) - length
        return cache, length

    def add(self, ids: list[int], cache: Any, *, fingerprint: int | None = None) -> None:
        """Keep `cache` (which holds exactly the keys and values of `ids`) for later restores.
        `fingerprint`: the weights' fingerprint when the cache was computed; an entry computed
        under other weights than the current ones is not kept. Entries that are a prefix of
        `ids` are dropped: this one covers them."""
        if self.max_bytes <= 0 or not ids:
            return
        current = self.fingerprint()
        if fingerprint is not None and fingerprint != current:
            return
        layers = _plain_layers(cache, len(ids))
        if layers is None:
            return
        array = np.asarray(ids, dtype=np.int64)
        for entry in list(self._entries):
            if entry.fingerprint != current or _is_prefix(entry.ids, array):
                self._drop(entry)
        nbytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size()
                     for k, v in layers)
        if nbytes > self.max_bytes:
            return
        while self._entries and self._bytes + nbytes > self.max_bytes:
            self._drop(self._entries[0])
        self._entries.append(_Entry(array, layers, nbytes, current))
        self._bytes += nbytes

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0

    def _longest(self, ids: np.ndarray, fingerprint: int) -> tuple[int, _Entry | None]:
        best, best_entry = 0, None
        limit = len(ids) - 1
        for entry in self._entries:
            if entry.fingerprint != fingerprint:
                continue
            n = min(limit, len(entry.ids))
            differ = np.flatnonzero(entry.ids[:n] != ids[:n])
            length = int(differ[0]) if differ.size else n
            if length > best:
                best, best_entry = length, entry
        return best, best_entry

    def _drop(self, entry: _Entry) -> None:
        self._entries.remove(entry)
        self._bytes -= entry.nbytes


def _is_prefix(short: np.ndarray, long: np.ndarray) -> bool:
    return len(short) <= len(long) and bool(np.array_equal(short, long[: len(short)]))


def _plain_layers(cache: Any, length: int) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
    """The (keys, values) of each layer, when every layer is a plain full-attention
    `DynamicLayer` holding `length` positions of one sequence; else None (sliding windows,
    recurrent state and batches are not sliced by position, so they are not cached)."""
    layers = getattr(cache, "layers", None)
    if not layers:
        return None
    out = []
    for layer in layers:
        if type(layer) is not DynamicLayer or not layer.is_initialized:
            return None
        keys, values = layer.keys, layer.values
        if keys.dim() != 4 or keys.shape[0] != 1 or keys.shape[-2] != length:
            return None
        out.append((keys, values))
    return out
