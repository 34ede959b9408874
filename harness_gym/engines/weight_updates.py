"""New weights for an in-process engine while it serves: between calls, never mid-generation.

An asynchronous trainer (`harness_gym.integrations.async_grpo`) keeps episodes running while it
steps the optimiser, so the engine that serves them holds its own copy of the weights and takes
the trainer's at each sync: `pause()` stops admitting calls and waits for the running ones to end,
`load_weights()` copies the tensors in on the decode thread, `resume()` lets the waiting calls
start on the new weights. A call is thus served by exactly one version, and the stream says which
(`LabelledStream.policy_version`, read by the proxy as it is for vLLM's `weight_versions`).

Why not share the trainer's tensors, as the synchronous `rollout_func` does: the optimiser
updates them in place, so a generation running across `optimizer.step()` would mix two policies
inside one answer while its logprobs claim one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import Any

import torch

from .base import EngineError, TokenChunk


class WeightUpdateError(EngineError):
    """The weights sent do not fit the engine's model (unknown name, wrong shape) or were sent
    while it was serving."""


class ServedVersion:
    """Where a stream's serving version is written (by the decode thread) and read."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value: int | None = None


class LabelledStream:
    """An engine stream that reports the version of the weights it was served with, set when
    its generation is admitted (None while waiting, or when the engine's weights have no
    version: the caller's label applies then).

    The generator and this wrapper share a `ServedVersion` and do not refer to each other: a
    stream abandoned mid-way (`break` out of `async for`) must be freed at once, so the event
    loop closes the generator and the engine stops generating for it.
    """

    def __init__(self, inner: AsyncIterator[TokenChunk], label: ServedVersion) -> None:
        self._inner = inner
        self._label = label

    @property
    def policy_version(self) -> int | None:
        return self._label.value

    def __aiter__(self) -> LabelledStream:
        return self

    async def __anext__(self) -> TokenChunk:
        return await anext(self._inner)

    async def aclose(self) -> None:
        await self._inner.aclose()  # type: ignore[attr-defined]  # an async generator


def copy_named_weights(model: Any, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
    """Copy `(name, tensor)` pairs into `model`'s parameters and buffers of the same names;
    answers how many were copied. Names are `named_parameters()`'s, as TRL's weight iterator
    yields them. Every name is checked before the first copy would be partial: a stream is
    consumed whole, then applied."""
    targets: dict[str, torch.Tensor] = dict(model.named_parameters())
    targets.update(model.named_buffers())
    received = list(weights)
    for name, tensor in received:
        target = targets.get(name)
        if target is None:
            raise WeightUpdateError(
                f"the engine's model has no parameter {name!r}: send the weights of the same "
                f"architecture (names like {next(iter(targets), '?')!r})")
        if tuple(target.shape) != tuple(tensor.shape):
            raise WeightUpdateError(f"{name}: shape {tuple(tensor.shape)} sent, the engine's "
                                    f"model has {tuple(target.shape)}")
    with torch.no_grad():
        for name, tensor in received:
            target = targets[name]
            target.copy_(tensor.detach().to(device=target.device, dtype=target.dtype))
    return len(received)
