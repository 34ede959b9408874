"""The engine seam: token ids in, token ids + per-token logprobs out, streamed.

An engine owns its tokenizer and chat template; the proxy never samples or scores text itself.
Every engine, local (transformers) or remote (vLLM over HTTP), implements `Engine.stream`:
an async iterator of `TokenChunk`s, the last of which carries the `finish_reason`.
Cancelling the iterator (closing it, or cancelling the task that drives it) aborts generation.

Everything a caller passes per request travels in the arguments (`RequestContext`: which
conversation, which policy version), never in ambient state, and every member a caller relies on
is declared here with its default.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

FinishReason = Literal["stop", "length", "abort"]


class EngineError(RuntimeError):
    """The engine could not serve a request (down, overloaded, crashed). Retriable."""


class ContextLengthExceeded(ValueError):
    """The prompt plus the requested completion does not fit the engine's context."""

    def __init__(self, prompt_tokens: int, max_context: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.max_context = max_context
        super().__init__(
            f"prompt is {prompt_tokens} tokens, the model's context length is {max_context}"
        )


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. `temperature == 0` means greedy.

    Logprobs are "processed": the log-probability of the sampled token under the distribution it
    was actually drawn from (after temperature, top-k and top-p), as vLLM reports with
    `--logprobs-mode processed_logprobs`. Greedy decoding reports the raw (T=1) logprob.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 512
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")


@dataclass(frozen=True)
class RequestContext:
    """Who a request is for, passed explicitly to `Engine.stream`.

    `routing_key` names the conversation (the proxy passes the session id), so an engine with
    several servers keeps a session on one server and its prefix cache warm. `policy_version`
    labels the completion (the session's version; None: the engine's current
    `Engine.policy_version`).
    """

    routing_key: str | None = None
    policy_version: int | None = None


NO_CONTEXT = RequestContext()


@dataclass
class TokenChunk:
    """Tokens sampled since the previous chunk. The last chunk of a stream has `finish_reason`."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason | None = None


@runtime_checkable
class ReportsVersion(Protocol):
    """A stream that knows which weights sampled it (vLLM's `weight_versions`, the in-process
    engine's load label). Its `policy_version`, read once the stream has ended, replaces the
    trainer's label in the trace; None means the engine reported none."""

    policy_version: int | None


@dataclass
class Completion:
    """A whole generation, assembled from a stream."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: FinishReason = "abort"
    policy_version: int = 0

    def add(self, chunk: TokenChunk) -> None:
        self.token_ids.extend(chunk.token_ids)
        self.logprobs.extend(chunk.logprobs)
        if chunk.finish_reason is not None:
            self.finish_reason = chunk.finish_reason


class Engine(abc.ABC):
    """A policy that samples completions for token prompts.

    Subclasses set `tokenizer` (a transformers tokenizer carrying the chat template),
    `max_context` (prompt + completion tokens), `model_name` and `stop_token_ids` (tokens that end
    an assistant turn; sampling one ends the stream with `finish_reason="stop"`, and the token is
    part of the completion). `policy_version` is set by the trainer after each weight update;
    every completion is tagged with the version it was sampled under.

    `tool_call_format` names the parser for tool calls in the model's text (see
    `proxy.tool_parsers`). `tokenizer_source` is what `harness-gym trace` reloads the tokenizer
    from (`"tiny"`, `"smollm2"` or a local directory; None when there is none to name), recorded
    in every episode's `info["tokenizer"]`. `accepts_images` says the model is multimodal.
    """

    model_name: str = "policy"
    max_context: int = 4096
    policy_version: int = 0
    stop_token_ids: tuple[int, ...] = ()
    tool_call_format: str = "hermes"
    tokenizer_source: str | None = None
    # The chat template takes images (content parts); a text-only engine is shown a recorded
    # text placeholder per image instead (`proxy.images`).
    accepts_images: bool = False

    @property
    @abc.abstractmethod
    def tokenizer(self):  # -> transformers.PreTrainedTokenizerBase
        ...

    @abc.abstractmethod
    def stream(
        self,
        prompt_ids: Sequence[int],
        sampling: SamplingParams,
        context: RequestContext = NO_CONTEXT,
    ) -> AsyncIterator[TokenChunk]:
        """Sample a completion token by token. Raises `ContextLengthExceeded` before sampling
        when the prompt does not fit, `EngineError` when the engine cannot serve."""

    async def generate(
        self,
        prompt_ids: Sequence[int],
        sampling: SamplingParams,
        context: RequestContext = NO_CONTEXT,
    ) -> Completion:
        completion = Completion(policy_version=self.version_for(context))
        async for chunk in self.stream(prompt_ids, sampling, context):
            completion.add(chunk)
        return completion

    def version_for(self, context: RequestContext) -> int:
        """The policy version a request's completion is labelled with."""
        return self.policy_version if context.policy_version is None else context.policy_version

    def set_weight_version(self, version: int) -> None:
        """Label the weights the engine serves from now on as `version`, after a weight sync.
        An engine whose servers label their own weights (vLLM) labels them too."""
        self.policy_version = int(version)

    def on_episode_start(self, task: Any) -> None:
        """Called as an episode on `task` starts (before its sandbox exists). A scripted policy
        learns the task's answer here; a sampling engine ignores it."""

    def check_fits(self, prompt_len: int) -> None:
        # A prompt that leaves no room for a single new token can never be answered.
        if prompt_len >= self.max_context:
            raise ContextLengthExceeded(prompt_len, self.max_context)

    def close(self) -> None:
        """Release what the engine holds (threads, HTTP clients, scoring models). Idempotent.
        The one shutdown path: `aclose` runs it off the event loop."""

    async def aclose(self) -> None:
        # Closing may block (a worker thread finishing its step): never on the event loop.
        await asyncio.to_thread(self.close)

    async def release_loop(self) -> None:
        """Called on an event loop that is about to end (the proxy's, when it stops): release
        what the engine opened on that loop (an HTTP client's connections belong to it)."""

    def __deepcopy__(self, memo: dict) -> Engine:
        # An engine is a shared service (weights, worker threads), not a value: gymnasium
        # deep-copies `make` kwargs when it re-creates an env from its spec, and that copy must
        # share the engine.
        return self
