"""`VLLMEngine`: one or several vLLM OpenAI-compatible servers behind the `Engine` seam.

Spec: `vllm:URL` or `vllm:URL1,URL2,...`, with options after a `?`:
`vllm:http://gpu0:8000,http://gpu1:8000?tokenizer=/models/qwen`. Options: `tokenizer` (a local
model/tokenizer directory, or `tiny` / `smollm2`), `model` (the served model name to request),
`max_context`, `ids_from` (`logprobs` | `echo`), `verify_logprobs` (`warn` | `strict` |
`off`), `health_period` (seconds).

Wire (vLLM 0.33, `POST /v1/completions`, see `_vllm_wire.py`): the prompt goes in as token ids;
`logprobs: 0` returns each sampled token's logprob, and with `return_tokens_as_token_ids` its id
as `logprobs.tokens[i] == "token_id:N"` (`ids_from="logprobs"`, the default), or with
`return_token_ids` in `choices[0].token_ids`, at the price of an echo of the whole prompt on the
first chunk (`ids_from="echo"`; the echo is cut out of the chunk unparsed). Either way the ids
the trace records are the server's, never re-tokenized. The admission probe (below) tells
whether a server honours `return_tokens_as_token_ids`; one that does not (its logprobs tokens
are text) is read with `echo` instead, which a warning says once per server
(`server_ids_from`). The prompt's JSON is kept per session and extended with each call's new
ids (`PromptEncoder`), so a call's cost does not grow with the episode. Every request sends
neutral `repetition_penalty`, `presence_penalty`, `frequency_penalty` and `min_p` (and the
temperature, top-p, top-k and `skip_special_tokens` it wants): vLLM fills whatever a request
leaves out from the model's `generation_config.json`.

Serve with:

- `--logprobs-mode processed_logprobs` (required for RL; `trl vllm-serve` sets it). vLLM's
  default reports logprobs of the raw distribution (T=1, before top-k/top-p); the trainer's
  importance ratio p_new / p_old needs p_old under the distribution the token was drawn from.
  The engine checks it: when a server comes into service it samples a few tokens with
  `top_k=1`, where processed logprobs are exactly 0.0, and records what it found in
  `logprobs_mode`. A server that answers otherwise gets a loud warning (`verify_logprobs=
  "warn"`, the default), or fails the constructor (or, if it came up later, stays out of
  service) under `verify_logprobs="strict"`, the setting for training runs; `"off"` accepts
  it silently.
- `VLLM_SERVER_DEV_MODE=1` if the trainer labels weight versions (below).
- `--max-model-len` sets the context this engine reads from `GET /v1/models`.

The tokenizer (the proxy renders chat templates and detokenizes with it) is loaded locally,
never downloaded: from `tokenizer=` / the constructor, else from the served model's id or root
when that is a local directory (`vllm serve /models/qwen` serves the id `/models/qwen`), else
the constructor fails with an error that says to pass `tokenizer=`. There is no silent default:
a wrong tokenizer would make every trace garbage without any error.

Several servers (`_vllm_servers.py`): a request is routed by consistent hashing of a routing key
(the proxy's session id, passed as `RequestContext.routing_key` to `stream()`), so all calls of
an episode land on one server and reuse its prefix cache. Servers that failed a request, or
whose `GET /health` is not 200, go to the back of every key's order until a background health
check (every `health_period_s`) sees them answer 200 again.

Failures (`_vllm_stream.py`): a failed request fails over to the next server of the key's
order; once a token has been yielded nothing is retried.

Policy version: the trainer's `policy_version` is the fallback label. vLLM 0.33 reports which
weights sampled each token (`return_weight_versions`: `weight_versions` spans on the last
chunk), labelled by `POST /update_weight_version` or `/finish_weight_update {"weight_version"}`
(dev mode); a fresh server says "default". TRL's weight syncs (sync `VLLMClient`, async
`WeightTransferClient`) finish with an empty `/finish_weight_update`, which leaves the label as
it was, so a trainer labels with `set_weight_version(v)` after each sync and before `/resume`.
`stream.policy_version` is the oldest integer label of the call's spans (None when there is
none), which the proxy records in place of the fallback.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Iterable, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import aiohttp
import httpx

from ._vllm_admin import (
    PROBE_REQUEST_ID,
    VERIFY_LOGPROBS,
    ServerCapabilities,
    VerifyLogprobs,
    VLLMConfigError,
    alabel_weights,
    check_processed,
    label_weights,
    probe_server,
)
from ._vllm_servers import HashRing, ServerPool
from ._vllm_stream import VLLMStream
from ._vllm_wire import (
    IDS_FROM,
    IdsFrom,
    PromptEncoder,
    WeightVersionSpan,
    completion_fields,
)
from .base import (
    NO_CONTEXT,
    Engine,
    EngineError,
    RequestContext,
    SamplingParams,
)

CLOSE_TIMEOUT_S = 10.0
MODELS_TIMEOUT_S = 30.0  # GET /v1/models answers at once from a server that is up
_JSON = {"content-type": "application/json"}

log = logging.getLogger(__name__)


class VLLMEngine(Engine):
    """Samples from vLLM servers over HTTP, token ids in and out.

    A code block, not a doctest (it needs a vLLM server)::

        engine = VLLMEngine(["http://127.0.0.1:8000"], tokenizer="/models/qwen")
        completion = await engine.generate(
            prompt_ids, SamplingParams(max_tokens=64), RequestContext(routing_key="session-1"))

    `tokenizer` is a tokenizer object or a local directory (or `tiny` / `smollm2`); `model_name`
    and `max_context` default to what `GET /v1/models` reports (the constructor then asks the
    servers, synchronously). Pass all three to build the engine without any server up. The
    constructor also runs one health check (and the logprobs probe) on every server it reaches.
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        tokenizer: Any = None,
        model_name: str | None = None,
        max_context: int | None = None,
        stop_token_ids: Iterable[int] | None = None,
        ids_from: IdsFrom = "logprobs",
        verify_logprobs: VerifyLogprobs | bool = "warn",
        health_period_s: float = 5.0,
        max_attempts: int = 4,
        backoff_s: float = 0.1,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float | None = 600.0,
    ) -> None:
        if ids_from not in IDS_FROM:
            raise ValueError(f"ids_from must be one of {IDS_FROM}, got {ids_from!r}")
        if isinstance(verify_logprobs, bool):  # the old on/off switch
            verify_logprobs = "warn" if verify_logprobs else "off"
        if verify_logprobs not in VERIFY_LOGPROBS:
            raise ValueError(f"verify_logprobs must be one of {VERIFY_LOGPROBS}, "
                             f"got {verify_logprobs!r}")
        self.verify_logprobs: VerifyLogprobs = verify_logprobs
        self.urls = _normalise_urls(urls)
        self.ids_from: IdsFrom = ids_from
        self.max_attempts = max(1, int(max_attempts))
        self.backoff_s = backoff_s
        # Admin calls (probe, health, labels) are rare and use httpx; the completions hop is
        # aiohttp's (`_client`).
        self._timeout = httpx.Timeout(read_timeout_s, connect=connect_timeout_s)
        self._stream_timeout = aiohttp.ClientTimeout(
            total=None, connect=connect_timeout_s, sock_read=read_timeout_s)
        # A ClientSession's connection pool belongs to the loop that opened it: one per loop.
        self._clients: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}
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
        #: What each server's probe found: "processed_logprobs", or what it saw instead.
        self.logprobs_mode: dict[str, str] = {}
        #: How each admitted server's sampled ids are read: `ids_from`, or "echo" for a server
        #: that ignores `return_tokens_as_token_ids` (found by the probe, said once in the log).
        self.server_ids_from: dict[str, IdsFrom] = {}
        self._prompts = PromptEncoder()
        # The probe learns two things; with the echo asked for and no check, neither is needed.
        probe = not (verify_logprobs == "off" and ids_from == "echo")
        self.servers = ServerPool(
            self.urls, admit=self._admit if probe else None, period_s=health_period_s,
            timeout_s=min(connect_timeout_s, 5.0),
        )
        self.servers.check(raise_for=(VLLMConfigError,))
        #: A server this engine started and stops on `close()` (the `vllm-serve:` spec).
        self.owned_server: Any = None

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def ring(self) -> HashRing:
        return self.servers.ring

    def server_for(self, key: str | None) -> str:
        """The URL a request with this routing key goes to first."""
        return self.servers.order(key)[0]

    def stream(
        self,
        prompt_ids: Sequence[int],
        sampling: SamplingParams,
        context: RequestContext = NO_CONTEXT,
    ) -> VLLMStream:
        if not isinstance(prompt_ids, list):  # e.g. a numpy array: compared id by id below
            prompt_ids = list(prompt_ids)
        if not prompt_ids:
            raise ValueError("prompt_ids is empty: a completion needs at least one prompt token")
        self.check_fits(len(prompt_ids))
        self.servers.start()
        _, prompt_json = self._prompts.encode(prompt_ids, context.routing_key)
        return VLLMStream(self, prompt_json, len(prompt_ids), sampling,
                          self.servers.order(context.routing_key))

    def request_body(
        self, prompt: list[int], sampling: SamplingParams, ids_from: IdsFrom | None = None
    ) -> dict[str, Any]:
        """The `/v1/completions` JSON for a token prompt. `max_tokens` is cut to what the
        context leaves, as vLLM would (so a misjudged `max_tokens` never costs a 400)."""
        return {"prompt": prompt, **self._request_fields(len(prompt), sampling,
                                                         ids_from or self.ids_from)}

    def _request_fields(
        self, prompt_len: int, sampling: SamplingParams, ids_from: IdsFrom
    ) -> dict[str, Any]:
        fits = min(sampling.max_tokens, self.max_context - prompt_len)
        if fits != sampling.max_tokens:
            sampling = dataclasses.replace(sampling, max_tokens=fits)
        stops = sorted({*self.stop_token_ids, *sampling.stop_token_ids})
        return completion_fields(self.model_name, sampling, stops, ids_from)

    def ids_from_for(self, url: str) -> IdsFrom:
        """How the sampled ids of `url` are read (its probe may have switched it to "echo")."""
        return self.server_ids_from.get(url, self.ids_from)

    # -- weight versions ------------------------------------------------------------------

    def set_weight_version(self, version: int) -> None:
        """Label the weights every server holds now as `version` (vLLM dev mode:
        `POST /update_weight_version`) and make it the fallback `policy_version`. Call it after
        each weight sync, before `/resume`. Blocks; from async code use `aset_weight_version`.
        A server that cannot be reached is skipped (it is out of service, and a restarted
        server says "default", so its calls fall back to `policy_version`)."""
        self.policy_version = int(version)
        label_weights(self.urls, version, self._timeout)

    async def aset_weight_version(self, version: int) -> None:
        """`set_weight_version` without blocking the event loop."""
        self.policy_version = int(version)
        async with httpx.AsyncClient(timeout=self._timeout) as client:
            await alabel_weights(client, self.urls, version)

    # -- server checks --------------------------------------------------------------------

    def _admit(self, url: str) -> None:
        """Probe a server coming into service: how it sends ids back, and its logprobs mode
        (checked as `verify_logprobs` says)."""
        prompt = self._tokenizer.encode("The logprobs of this probe", add_special_tokens=False)
        found = probe_server(url, self.model_name, prompt or [self.stop_token_ids[0]],
                             self._timeout)
        self.logprobs_mode[url] = found.logprobs_mode
        self._negotiate_ids(url, found)
        check_processed(url, found.logprobs_mode, self.verify_logprobs)

    def _negotiate_ids(self, url: str, found: ServerCapabilities) -> None:
        wanted = self.ids_from
        if wanted == "logprobs" and not found.token_ids_in_logprobs:
            wanted = "echo"
            if self.server_ids_from.get(url) != "echo":
                log.warning(
                    "vLLM at %s ignores return_tokens_as_token_ids (its logprobs tokens read "
                    "%r, not 'token_id:N'): reading its sampled ids from return_token_ids "
                    "(ids_from=echo) instead", url, list(found.sample_tokens))
        self.server_ids_from[url] = wanted

    def _probe_models(self) -> dict[str, Any]:
        errors = []
        for url in self.urls:
            try:
                response = httpx.get(f"{url}/v1/models", timeout=httpx.Timeout(
                    MODELS_TIMEOUT_S, connect=self._timeout.connect))
                response.raise_for_status()
                return response.json()["data"][0]
            except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
                errors.append(_unreachable(url, exc))
        raise EngineError(
            "no vLLM server answered GET /v1/models: " + "; ".join(errors)
            + " (or pass model, max_context and tokenizer to build the engine without one)"
        )

    # -- lifecycle ------------------------------------------------------------------------

    def _client(self) -> aiohttp.ClientSession:
        """The completions hop's HTTP client on this loop. aiohttp, not httpx: with its C
        parser a streamed call with a 30k-id prompt (and its echo) cost 0.6 ms of client CPU
        where httpx + h11 took 2.4-3.0 ms (measured side by side against the shared fake
        engine), a fifth of the proxy's whole CPU per call."""
        loop = asyncio.get_running_loop()
        for stale in [lp for lp in self._clients if lp.is_closed()]:
            del self._clients[stale]
        client = self._clients.get(loop)
        if client is None or client.closed:
            client = aiohttp.ClientSession(
                timeout=self._stream_timeout,
                connector=aiohttp.TCPConnector(limit=0, limit_per_host=0),
                auto_decompress=False,
            )
            self._clients[loop] = client
        return client

    async def release_loop(self) -> None:
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.close()  # else aiohttp warns of an unclosed connector at exit

    def close(self) -> None:
        """Stop the health checks and close the HTTP clients, each on the event loop that
        opened it (an `AsyncClient`'s connections belong to their loop). A client whose loop
        has already ended is dropped: its connections went with the loop. From inside a loop,
        `await aclose()` instead."""
        self.servers.close()
        clients, self._clients = dict(self._clients), {}
        try:
            current = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        for loop, client in clients.items():
            if loop.is_closed():
                continue
            if loop is current:  # waiting here would block the loop that must do the closing
                loop.create_task(client.close())
            elif loop.is_running():
                done = asyncio.run_coroutine_threadsafe(client.close(), loop)
                try:
                    done.result(CLOSE_TIMEOUT_S)
                except (FutureTimeout, RuntimeError):  # the loop stopped meanwhile
                    done.cancel()
            else:
                loop.run_until_complete(client.close())
        server, self.owned_server = self.owned_server, None
        if server is not None:
            server.stop()


def _unreachable(url: str, exc: Exception) -> str:
    """What a failed `GET /v1/models` means, and what to do, in a few words."""
    if isinstance(exc, httpx.ConnectError):
        # vLLM 0.32 binds its port only once the model is loaded: "loading" looks the same.
        return (f"nothing is listening at {url}: start a server (`harness-gym vllm-serve "
                "MODEL_DIR`), or if one is still loading its model, wait until its "
                "GET /health answers 200")
    if isinstance(exc, httpx.TimeoutException):
        return (f"{url} accepts connections but does not answer within "
                f"{MODELS_TIMEOUT_S:.0f} s: a server still starting, or hung?")
    if isinstance(exc, httpx.HTTPStatusError):
        return f"{url} answered HTTP {exc.response.status_code}: is it a vLLM server?"
    return f"{url}: {exc!r}"


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


_VERIFY_WORDS: dict[str, VerifyLogprobs] = {
    "1": "warn", "true": "warn", "yes": "warn", "0": "off", "false": "off", "no": "off"}
_OPTIONS = ("tokenizer", "model", "max_context", "ids_from", "verify_logprobs", "health_period")


def load_vllm_engine(arg: str) -> VLLMEngine:
    """Entry point for `vllm:URL[,URL...][?tokenizer=PATH&model=NAME&max_context=N&...]`."""
    if not arg:
        raise ValueError("the vllm engine needs a server URL: 'vllm:http://host:8000'")
    urls, _, query = arg.partition("?")
    options = {k: v[-1] for k, v in parse_qs(query).items()}
    unknown = set(options) - set(_OPTIONS)
    if unknown:
        raise ValueError(f"unknown vllm spec options {sorted(unknown)}: known are "
                         + ", ".join(_OPTIONS))
    kwargs: dict[str, Any] = {}
    if "ids_from" in options:
        kwargs["ids_from"] = options["ids_from"]
    if "verify_logprobs" in options:
        kwargs["verify_logprobs"] = _VERIFY_WORDS.get(options["verify_logprobs"].lower(),
                                                      options["verify_logprobs"])
    if "health_period" in options:
        kwargs["health_period_s"] = float(options["health_period"])
    return VLLMEngine(
        urls,
        tokenizer=options.get("tokenizer"),
        model_name=options.get("model"),
        max_context=int(options["max_context"]) if "max_context" in options else None,
        **kwargs,
    )


__all__ = [
    "PROBE_REQUEST_ID",
    "HashRing",
    "VLLMConfigError",
    "VLLMEngine",
    "VLLMStream",
    "WeightVersionSpan",
    "load_vllm_engine",
]
