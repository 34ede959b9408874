"""`VLLMStream`: one streamed completion from a `VLLMEngine`'s servers, with failover.

Failures: a connection error, a 5xx answer (vLLM answers 500 once its engine died, 503 when
overloaded or paused), or a 5xx error event before the first token fails over to the next
server in the key's order, with exponential backoff between passes; after `max_attempts` tries
the stream raises `EngineError`. Once a token has been yielded nothing is retried (a retry would
sample different tokens after the ones already streamed). A prompt that does not fit raises
`ContextLengthExceeded`, whichever wording vLLM used; a prompt that fits with fewer new tokens
than asked is answered with fewer (vLLM shortens `max_tokens` itself).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, Protocol

import aiohttp
import orjson

from ._vllm_servers import ServerPool
from ._vllm_wire import (
    IdsFrom,
    RetryElsewhere,
    WeightVersionSpan,
    drop_prompt_echo,
    encode_body,
    error_for,
    parse_chunk,
    policy_version_of,
    sse_data,
    stream_error,
)
from .base import EngineError, SamplingParams, TokenChunk


class StreamSource(Protocol):
    """What a stream needs of its `VLLMEngine` (a protocol: the engine imports this module)."""

    max_attempts: int
    backoff_s: float
    servers: ServerPool

    def ids_from_for(self, url: str) -> IdsFrom: ...

    def _client(self) -> aiohttp.ClientSession: ...

    def _request_fields(self, prompt_len: int, sampling: SamplingParams,
                        ids_from: IdsFrom) -> dict[str, Any]: ...

DRAIN_TIMEOUT_S = 0.5
# What a broken connection, a refused one or a read past `read_timeout_s` raises.
TRANSPORT_ERRORS = (aiohttp.ClientError, TimeoutError)
_JSON = {"content-type": "application/json"}


class VLLMStream:
    """One streamed completion (an async iterator of `TokenChunk`). `server` is known once the
    first chunk has arrived; `weight_versions` and `policy_version` once the stream ended."""

    def __init__(
        self,
        engine: StreamSource,
        prompt_json: bytes,
        prompt_len: int,
        sampling: SamplingParams,
        order: list[str],
    ) -> None:
        self._engine = engine
        self._prompt_json = prompt_json
        self._prompt_len = prompt_len
        self._sampling = sampling
        self._bodies: dict[IdsFrom, bytes] = {}
        self._order = order
        self._inner = self._run()
        self.server: str | None = None
        self.weight_versions: list[WeightVersionSpan] | None = None
        self.attempts: list[str] = []  # "url: error" for each failed attempt

    @property
    def policy_version(self) -> int | None:
        """The version the server reported for this call (its oldest integer label)."""
        return policy_version_of(self.weight_versions)

    def __aiter__(self) -> VLLMStream:
        return self

    async def __anext__(self) -> TokenChunk:
        return await self._inner.__anext__()

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def _run(self) -> AsyncIterator[TokenChunk]:
        engine = self._engine
        started = False
        for attempt in range(engine.max_attempts):
            url = self._order[attempt % len(self._order)]
            if attempt and attempt % len(self._order) == 0:  # a full pass failed: back off
                await asyncio.sleep(engine.backoff_s * 2 ** (attempt // len(self._order) - 1))
            ids_from = engine.ids_from_for(url)
            try:
                async with engine._client().post(
                    f"{url}/v1/completions", data=self._body(ids_from), headers=_JSON,
                ) as response:
                    if response.status != 200:
                        body = (await response.read()).decode(errors="replace")
                        raise error_for(response.status, body, url, self._prompt_len)
                    self.server = url
                    async for chunk in self._chunks(response, url, ids_from):
                        started = True
                        yield chunk
                    return
            except TRANSPORT_ERRORS as exc:
                if started:  # e.g. closing the response: tokens went out, never retry
                    raise EngineError(f"the vLLM stream from {url} broke: {exc!r}") from exc
                failure = f"{url}: {exc!r}"
            except RetryElsewhere as exc:
                failure = f"{url}: {exc}"
            self.attempts.append(failure)
            engine.servers.take_out(url, failure)
        raise EngineError(
            f"vLLM request failed after {engine.max_attempts} attempts: " + "; ".join(self.attempts)
        )

    def _body(self, ids_from: IdsFrom) -> bytes:
        body = self._bodies.get(ids_from)
        if body is None:
            fields = self._engine._request_fields(self._prompt_len, self._sampling, ids_from)
            body = self._bodies[ids_from] = encode_body(fields, self._prompt_json)
        return body

    async def _chunks(
        self, response: aiohttp.ClientResponse, url: str, ids_from: IdsFrom
    ) -> AsyncIterator[TokenChunk]:
        yielded = False
        events = sse_data(response.content.iter_any())
        try:
            async for data in events:
                if data == b"[DONE]":
                    break
                if ids_from == "echo" and not yielded:
                    data = drop_prompt_echo(data)  # the prompt we sent, ~30k ids
                payload = orjson.loads(data)
                if "error" in payload:
                    error = stream_error(payload, url)
                    if yielded and isinstance(error, RetryElsewhere):
                        error = EngineError(f"the vLLM stream from {url} failed: {error}")
                    raise error
                parsed = parse_chunk(payload, ids_from)
                if parsed is None:
                    continue
                chunk, spans = parsed
                if spans is not None:
                    self.weight_versions = spans
                if chunk.finish_reason is not None:
                    await _read_to_end(events)
                if chunk.token_ids or chunk.finish_reason is not None:
                    yielded = True
                    yield chunk
                if chunk.finish_reason is not None:
                    return
        except TRANSPORT_ERRORS as exc:
            if not yielded:
                raise RetryElsewhere(f"the stream broke before any token: {exc!r}") from exc
            raise EngineError(f"the vLLM stream from {url} broke: {exc!r}") from exc
        except orjson.JSONDecodeError as exc:
            raise EngineError(f"the vLLM stream from {url} sent invalid JSON: {exc}") from exc
        raise EngineError(f"the vLLM stream from {url} ended without a finish_reason")


async def _read_to_end(events: AsyncIterator[bytes]) -> None:
    """Read what follows the finishing chunk (`data: [DONE]`, a usage chunk) before handing it
    on: a response closed unread takes its connection with it, and every call then paid for
    a new TCP connection (measured: the largest single cost of a call through the proxy). A
    server that keeps the stream open longer than `DRAIN_TIMEOUT_S` loses the connection."""
    try:
        async with asyncio.timeout(DRAIN_TIMEOUT_S):
            async for _ in events:
                pass
    except TRANSPORT_ERRORS:  # TimeoutError among them
        pass
