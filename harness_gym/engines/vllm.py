"""`VLLMEngine`: one or several vLLM OpenAI-compatible servers behind the `Engine` seam.

Spec: `vllm:URL` or `vllm:URL1,URL2,...`, with options after a `?`:
`vllm:http://gpu0:8000,http://gpu1:8000?tokenizer=/models/qwen`. Options: `tokenizer` (a local
model/tokenizer directory, or `tiny` / `smollm2`), `model` (the served model name to request),
`max_context`.

Wire (vLLM 0.33, `POST /v1/completions`): the prompt goes in as token ids (`prompt: [int, ...]`),
`return_token_ids: true` makes every streamed chunk carry `choices[0].token_ids` (and the first
one `prompt_token_ids`), `logprobs: 0` makes it carry `logprobs.token_logprobs`, the sampled
tokens' logprobs. Nothing is ever re-tokenized: the ids the trace records are the server's.
`skip_special_tokens: false` and `include_stop_str_in_output: true` keep the text consistent with
the ids (the stop token is part of the completion, as the `Engine` contract says).

Serve with these flags:

- `--logprobs-mode processed_logprobs` (required for RL). By default vLLM reports logprobs of
  the raw distribution (T=1, before top-k/top-p). The trainer's importance ratio
  p_new / p_old needs p_old to be the probability under the distribution the token was actually
  drawn from, i.e. after temperature, top-k and top-p; otherwise every off-T=1 sample carries a
  systematic bias in the ratio. `SamplingParams` documents the same convention for local engines.
- `--return-tokens-as-token-ids` is not needed: `return_token_ids` already returns ids.
- `--max-model-len` sets the context this engine reports (`max_model_len` of `GET /v1/models`).

The tokenizer (the proxy renders chat templates and detokenizes with it) is loaded locally,
never downloaded: from `tokenizer=` / the constructor, else from the served model's id or root
when that is a local directory (`vllm serve /models/qwen` serves the id `/models/qwen`), else
the constructor fails with an error that says to pass `tokenizer=`. There is no silent default:
a wrong tokenizer would make every trace garbage without any error.

Several servers: a request is routed by consistent hashing of a routing key (the proxy's session
id, passed in `stream()`'s `RequestContext.routing_key`), so all calls of
an episode land on one server and reuse its prefix cache; adding a server moves only ~1/N of the
sessions. Without a key, requests go round-robin.

Failures: a connection error, or a 502/503/504 answer, *before the first token* is retried on
the next server of the key's ring order (affinity is a cache optimisation, not a correctness
requirement, so failing over beats waiting on a dead server), with exponential backoff between
passes over the ring; after `max_attempts` tries the stream raises `EngineError`. Once a token has
been yielded nothing is retried (a retry would sample different tokens after the ones already
streamed): a failure then is an `EngineError` and the call is recorded as aborted.

Policy version: `policy_version` is the trainer's attribute, as for every engine. A server that
reports the version of the weights it sampled with, in an `x-policy-version` response header
(a trainer's weight-sync endpoint can set it; plain vLLM does not), is the better witness: the
stream object exposes it as `stream.policy_version` once the first chunk has arrived
(None when the server reported none).
"""

from __future__ import annotations

import asyncio
import bisect
import hashlib
import itertools
import json
import re
from collections.abc import AsyncIterator, Iterable, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import httpx

from .base import (
    NO_CONTEXT,
    ContextLengthExceeded,
    Engine,
    EngineError,
    FinishReason,
    RequestContext,
    SamplingParams,
    TokenChunk,
)

POLICY_VERSION_HEADER = "x-policy-version"
_RETRIABLE_STATUS = frozenset({502, 503, 504})
_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}
# vLLM's context-length message: "This model's maximum context length is 4096 tokens. However,
# you requested 5000 tokens (4000 in the messages, 1000 in the completion)..."
CLOSE_TIMEOUT_S = 10.0
_CONTEXT_RE = re.compile(r"maximum context length is (\d+) tokens.*?requested (\d+) tokens", re.DOTALL)


class _RetryBeforeFirstToken(Exception):
    """A failure that happened before any token was yielded: safe to try another server."""


class HashRing:
    """Consistent hashing of routing keys onto servers (`replicas` virtual nodes each)."""

    def __init__(self, servers: Sequence[str], replicas: int = 128) -> None:
        if not servers:
            raise ValueError("a hash ring needs at least one server")
        self.servers = list(servers)
        points = sorted(
            (_hash(f"{server}#{i}"), index)
            for index, server in enumerate(self.servers)
            for i in range(replicas)
        )
        self._hashes = [h for h, _ in points]
        self._owners = [index for _, index in points]

    def order(self, key: str) -> list[int]:
        """Server indices for `key`: its owner first, then the next distinct servers clockwise."""
        start = bisect.bisect(self._hashes, _hash(key)) % len(self._hashes)
        seen: dict[int, None] = {}
        for owner in itertools.chain(self._owners[start:], self._owners[:start]):
            seen.setdefault(owner)
            if len(seen) == len(self.servers):
                break
        return list(seen)


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class VLLMEngine(Engine):
    """Samples from vLLM servers over HTTP, token ids in and out.

    >>> engine = VLLMEngine(["http://127.0.0.1:8000"], tokenizer="/models/qwen")  # doctest: +SKIP
    >>> completion = await engine.generate(                                  # doctest: +SKIP
    ...     prompt_ids, SamplingParams(max_tokens=64), RequestContext(routing_key="session-1"))

    `tokenizer` is a tokenizer object or a local directory (or `tiny` / `smollm2`); `model_name`
    and `max_context` default to what `GET /v1/models` reports (the constructor then asks the
    servers, synchronously). Pass all three to build the engine without any server up.
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        tokenizer: Any = None,
        model_name: str | None = None,
        max_context: int | None = None,
        stop_token_ids: Iterable[int] | None = None,
        max_attempts: int = 4,
        backoff_s: float = 0.1,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float | None = 600.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.urls = _normalise_urls(urls)
        self.ring = HashRing(self.urls)
        self.max_attempts = max(1, int(max_attempts))
        self.backoff_s = backoff_s
        self._timeout = httpx.Timeout(read_timeout_s, connect=connect_timeout_s)
        self._transport = transport
        # An AsyncClient's connection pool belongs to the loop that opened it: one per loop.
        self._clients: dict[asyncio.AbstractEventLoop, httpx.AsyncClient] = {}
        self._round_robin = itertools.count()
        if model_name is None or max_context is None or tokenizer is None:
            served = self._probe_models()
            model_name = model_name or served["id"]
            max_context = max_context or served.get("max_model_len")
            if tokenizer is None:
                tokenizer = _local_model_dir(served)
        if not max_context:
            raise EngineError("the vLLM server reports no max_model_len: pass max_context")
        self.model_name = model_name
        self.max_context = int(max_context)
        self._tokenizer = _load_tokenizer(tokenizer)
        if isinstance(tokenizer, (str, Path)):
            self.tokenizer_source = str(tokenizer)
        self.stop_token_ids = tuple(
            int(t) for t in (stop_token_ids if stop_token_ids is not None
                             else _default_stop_token_ids(self._tokenizer))
        )

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def server_for(self, key: str | None) -> str:
        """The URL a request with this routing key goes to first."""
        return self.urls[self._order(key)[0]]

    def stream(
        self,
        prompt_ids: Sequence[int],
        sampling: SamplingParams,
        context: RequestContext = NO_CONTEXT,
    ) -> VLLMStream:
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ValueError("prompt_ids is empty: a completion needs at least one prompt token")
        self.check_fits(len(prompt))
        order = self._order(context.routing_key)
        return VLLMStream(self, self.request_body(prompt, sampling), order)

    def request_body(self, prompt: list[int], sampling: SamplingParams) -> dict[str, Any]:
        """The `/v1/completions` JSON for a token prompt (field names of vLLM's
        `CompletionRequest`)."""
        body: dict[str, Any] = {
            "model": self.model_name,
            "prompt": prompt,
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k or -1,  # vLLM: -1 disables
            "stop_token_ids": sorted({*self.stop_token_ids, *sampling.stop_token_ids}),
            "logprobs": 0,
            "return_token_ids": True,
            "skip_special_tokens": False,
            "include_stop_str_in_output": True,
            "stream": True,
        }
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        return body

    def _order(self, key: str | None) -> list[int]:
        if key is None:
            first = next(self._round_robin) % len(self.urls)
            return [*range(first, len(self.urls)), *range(first)]
        return self.ring.order(key)

    def _client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        for stale in [lp for lp in self._clients if lp.is_closed()]:
            del self._clients[stale]
        client = self._clients.get(loop)
        if client is None or client.is_closed:
            client = httpx.AsyncClient(
                timeout=self._timeout,
                transport=self._transport,
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
            )
            self._clients[loop] = client
        return client

    def _probe_models(self) -> dict[str, Any]:
        errors = []
        for url in self.urls:
            try:
                response = httpx.get(f"{url}/v1/models", timeout=self._timeout)
                response.raise_for_status()
                return response.json()["data"][0]
            except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
                errors.append(f"{url}: {exc!r}")
        raise EngineError(
            "no vLLM server answered GET /v1/models (pass model_name, max_context and tokenizer "
            "to build the engine without one): " + "; ".join(errors)
        )

    def close(self) -> None:
        """Close the HTTP clients, each on the event loop that opened it (an `AsyncClient`'s
        connections belong to their loop). A client whose loop has already ended is dropped:
        its connections went with the loop. From inside a loop, `await aclose()` instead."""
        clients, self._clients = dict(self._clients), {}
        try:
            current = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        for loop, client in clients.items():
            if loop.is_closed():
                continue
            if loop is current:  # waiting here would block the loop that must do the closing
                loop.create_task(client.aclose())
            elif loop.is_running():
                done = asyncio.run_coroutine_threadsafe(client.aclose(), loop)
                try:
                    done.result(CLOSE_TIMEOUT_S)
                except (FutureTimeout, RuntimeError):  # the loop stopped meanwhile
                    done.cancel()
            else:
                loop.run_until_complete(client.aclose())


class VLLMStream:
    """One streamed completion (an async iterator of `TokenChunk`). `server` and
    `policy_version` are known once the first chunk has arrived."""

    def __init__(self, engine: VLLMEngine, body: dict[str, Any], order: list[int]) -> None:
        self._engine = engine
        self._body = body
        self._order = order
        self._inner = self._run()
        self.server: str | None = None
        self.policy_version: int | None = None
        self.attempts: list[str] = []  # "url: error" for each failed attempt

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
            url = engine.urls[self._order[attempt % len(self._order)]]
            if attempt and attempt % len(self._order) == 0:  # a full pass failed: back off
                await asyncio.sleep(engine.backoff_s * 2 ** (attempt // len(self._order) - 1))
            try:
                async with engine._client().stream(
                    "POST", f"{url}/v1/completions", json=self._body
                ) as response:
                    await _check_status(response)
                    self.server = url
                    self.policy_version = _header_int(response, POLICY_VERSION_HEADER)
                    async for chunk in self._chunks(response):
                        started = True
                        yield chunk
                    return
            except httpx.TransportError as exc:
                if started:  # e.g. closing the response: tokens went out, never retry
                    raise EngineError(f"the vLLM stream from {url} broke: {exc!r}") from exc
                self.attempts.append(f"{url}: {exc!r}")
            except _RetryBeforeFirstToken as exc:
                self.attempts.append(f"{url}: {exc.__cause__ or exc}")
        raise EngineError(
            f"vLLM request failed after {engine.max_attempts} attempts: " + "; ".join(self.attempts)
        )

    async def _chunks(self, response: httpx.Response) -> AsyncIterator[TokenChunk]:
        yielded = False
        try:
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = _parse_chunk(json.loads(data))
                if chunk is None:
                    continue
                if chunk.token_ids or chunk.finish_reason is not None:
                    yielded = True
                    yield chunk
                if chunk.finish_reason is not None:
                    return
        except (httpx.TransportError, json.JSONDecodeError) as exc:
            if not yielded and isinstance(exc, httpx.TransportError):
                raise _RetryBeforeFirstToken(str(exc)) from exc
            raise EngineError(f"the vLLM stream from {self.server} broke: {exc!r}") from exc
        raise EngineError(f"the vLLM stream from {self.server} ended without a finish_reason")


async def _check_status(response: httpx.Response) -> None:
    if response.status_code == 200:
        return
    body = (await response.aread()).decode(errors="replace")
    message = _error_message(body)
    if response.status_code in _RETRIABLE_STATUS:
        raise _RetryBeforeFirstToken(f"HTTP {response.status_code}: {message}")
    context = _CONTEXT_RE.search(message)
    if context:
        raise ContextLengthExceeded(int(context.group(2)), int(context.group(1)))
    raise EngineError(f"vLLM answered HTTP {response.status_code}: {message}")


def _parse_chunk(payload: dict[str, Any]) -> TokenChunk | None:
    """A `CompletionStreamResponse` chunk -> the tokens it adds (None for a usage-only chunk)."""
    if "error" in payload:  # vLLM reports an in-stream failure as {"error": {...}}
        raise EngineError(f"vLLM failed mid-stream: {_error_message(json.dumps(payload))}")
    choices = payload.get("choices") or []
    if not choices:
        return None
    choice = choices[0]
    token_ids = [int(t) for t in choice.get("token_ids") or []]
    logprobs = (choice.get("logprobs") or {}).get("token_logprobs") or []
    if token_ids and len(logprobs) != len(token_ids):
        raise EngineError(
            f"vLLM sent {len(token_ids)} token ids with {len(logprobs)} logprobs: is the request's "
            "`logprobs: 0` honoured and `return_token_ids` supported (vLLM >= 0.10.2)?"
        )
    reason = choice.get("finish_reason")
    finish = None if reason is None else _FINISH.get(reason, "abort")
    return TokenChunk(token_ids, [float(x) for x in logprobs], finish)


def _error_message(body: str) -> str:
    try:
        payload = json.loads(body)
    except ValueError:
        return body[:500]
    error = payload.get("error", payload) if isinstance(payload, dict) else payload
    if isinstance(error, dict):
        return str(error.get("message", error))
    return str(error)


def _header_int(response: httpx.Response, name: str) -> int | None:
    value = response.headers.get(name)
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def _normalise_urls(urls: str | Sequence[str]) -> list[str]:
    items = urls.split(",") if isinstance(urls, str) else list(urls)
    out = []
    for url in (u.strip().rstrip("/") for u in items):
        if not url:
            continue
        if not url.startswith(("http://", "https://")):
            url = "http://" + url
        out.append(url.removesuffix("/v1"))
    if not out:
        raise ValueError("the vllm engine needs at least one server URL: 'vllm:http://host:8000'")
    return out


def _local_model_dir(served: dict[str, Any]) -> Path:
    for candidate in (served.get("root"), served.get("id")):
        if candidate and Path(candidate).expanduser().is_dir():
            return Path(candidate).expanduser()
    raise EngineError(
        f"the vLLM server serves {served.get('id')!r}, which is not a local directory here: "
        "pass the tokenizer ('vllm:URL?tokenizer=/path/to/model' or tokenizer=...)"
    )


def _load_tokenizer(tokenizer: Any) -> Any:
    if not isinstance(tokenizer, (str, Path)):
        return tokenizer
    if str(tokenizer) == "tiny":
        from .tiny import load_tiny_tokenizer

        return load_tiny_tokenizer()
    if str(tokenizer) == "smollm2":
        from .smollm2 import smollm2_model_dir

        tokenizer = smollm2_model_dir()
    from transformers import AutoTokenizer

    directory = Path(tokenizer).expanduser()
    if not directory.is_dir():
        raise FileNotFoundError(f"no tokenizer directory at {directory}")
    return AutoTokenizer.from_pretrained(directory, local_files_only=True)


def _default_stop_token_ids(tokenizer: Any) -> list[int]:
    stops = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
    im_end = tokenizer.get_vocab().get("<|im_end|>")
    if im_end is not None and im_end not in stops:
        stops.append(im_end)
    return stops


def load_vllm_engine(arg: str) -> VLLMEngine:
    """Entry point for `vllm:URL[,URL...][?tokenizer=PATH&model=NAME&max_context=N]`."""
    if not arg:
        raise ValueError("the vllm engine needs a server URL: 'vllm:http://host:8000'")
    urls, _, query = arg.partition("?")
    options = {k: v[-1] for k, v in parse_qs(query).items()}
    unknown = set(options) - {"tokenizer", "model", "max_context"}
    if unknown:
        raise ValueError(f"unknown vllm spec options {sorted(unknown)}: "
                         "known are tokenizer, model, max_context")
    return VLLMEngine(
        urls,
        tokenizer=options.get("tokenizer"),
        model_name=options.get("model"),
        max_context=int(options["max_context"]) if "max_context" in options else None,
    )


__all__ = [
    "POLICY_VERSION_HEADER",
    "HashRing",
    "VLLMEngine",
    "VLLMStream",
    "load_vllm_engine",
]
