"""A wire-protocol fake of a vLLM 0.33 server, sampling with the tiny model.

vLLM cannot run on this machine (its wheel is CUDA-only and pins its own torch), so
`VLLMEngine` is tested against this real HTTP server (starlette + uvicorn on 127.0.0.1, port 0,
in a thread). It is a fake of vLLM's *wire protocol* only: what goes in and out of its HTTP
routes, with the field names, shapes, status codes and error wordings of the vLLM 0.33.0 source
(each rule below names the file it follows). Sampling is the tiny `TransformersEngine`'s.

- `GET /v1/models`: a `ModelList` whose card carries `max_model_len`
  (entrypoints/serve/engine/protocol.py `ModelCard`).
- `GET /health`: 200, or 503 once the engine is dead (`dead = True`;
  entrypoints/serve/instrumentator/health.py).
- `POST /v1/completions` (entrypoints/openai/completion/{protocol,serving}.py), checks in vLLM's
  order: the model name (404 `NotFoundError`, param "model", `_check_model`); a dead engine
  (500 `InternalServerError`, "The server had an error while processing your request.",
  `EngineDeadError.CLIENT_MESSAGE`); admission (`overloaded`: 503 "Service Unavailable",
  `QueueOverflowError`); `max_tokens` above `max_model_len` (400, `TokenizeParams`); a prompt
  above `max_model_len` (400, "...However, your prompt contains M input tokens, which exceeds
  this limit even without any output tokens...", param "input_tokens",
  renderers/params.py `_token_len_check`); then `max_tokens` is cut to what the context leaves
  (`get_max_tokens`), 400 "max_tokens must be at least 1, got 0." when nothing is left.
  Sampling fields a request leaves out come from `generation_config` (`to_sampling_params`:
  request, else server default, else neutral); `effective` records what vLLM would sample with.
  Only temperature, top-p and top-k are applied: the tiny engine has no penalties.
- Logprobs are processed (after temperature, top-k, top-p) only when the server is started with
  `logprobs_mode="processed_logprobs"`; vLLM's default `raw_logprobs` reports the T=1
  teacher-forced logprob of each sampled token (v1/sample/sampler.py).
- `text` honours `skip_special_tokens` (default True) and `include_stop_str_in_output` (a stop
  token's text is left out unless it is set; v1/engine/detokenizer.py); ids always include it.
- Streamed chunks are `CompletionStreamResponse`s dumped with `exclude_unset`: every choice has
  `text`, `logprobs`, `finish_reason`, `stop_reason` (the stop token id, None on EOS: v1/core/
  sched/utils.py `check_stop`), `prompt_token_ids` (the prompt on the first chunk with
  `return_token_ids`), `token_ids` (with `return_token_ids`), `weight_versions` (spans, on the
  last chunk with `return_weight_versions`); no `usage` key unless `stream_options.include_usage`
  (then a last chunk with `choices: []`). `return_tokens_as_token_ids` writes logprobs tokens as
  "token_id:N" (`token_ids_in_logprobs=False` ignores it, as servers without the flag do). A paused engine (abort/wait) answers a stream with 200 and an error event 503.
- Dev mode (`dev_mode=True`, vLLM's `VLLM_SERVER_DEV_MODE=1`; entrypoints/rl/online/
  api_router.py): `/pause?mode=abort|wait|keep`, `/resume`, `/is_paused`,
  `/start_weight_update`, `/update_weights`, `/finish_weight_update` (optional
  `{"weight_version": str}`: without it the label is unchanged), `/update_weight_version`
  (`{"new_version": str}`), `/weight_info`, `/reset_prefix_cache`, `/get_world_size`. The label
  starts as "default" (v1/engine/core.py). A token is labelled with the label current when it
  is delivered; `keep` holds deliveries until `/resume`.

Every completions request is recorded (`served`) with what was sent back, and the dev-mode
calls in `control`, so a test compares the engine's output with the wire.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from harness_gym.engines import Engine, SamplingParams
from harness_gym.engines.vllm import PROBE_REQUEST_ID

# `CompletionRequest._DEFAULT_SAMPLING_PARAMS`: what vLLM samples with when neither the request
# nor the model's generation config says.
VLLM_NEUTRAL = {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
                "temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0}
DEAD_MESSAGE = "The server had an error while processing your request."
BUSY_MESSAGE = ("The engine is currently busy and cannot accept new requests. Please try again "
                "later or on a different instance.")
PAUSED_MESSAGE = "Generation is paused. Please retry after it resumes."


@dataclass
class ServedRequest:
    """One `/v1/completions` request and what the server sent back for it."""

    body: dict[str, Any]
    peer: int | None = None  # the client's port: one per TCP connection
    status: int = 200
    error: str | None = None  # the error message, when one was sent
    effective: dict[str, Any] = field(default_factory=dict)  # sampling vLLM would use
    max_tokens: int | None = None  # after vLLM cut it to the context
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    stop_reason: int | None = None
    weight_versions: list[dict[str, Any]] = field(default_factory=list)
    chunks: list[dict[str, Any]] = field(default_factory=list)  # streamed, as sent

    @property
    def is_probe(self) -> bool:
        """The engine's logprobs-mode probe (not a model call of a test)."""
        return str(self.body.get("request_id", "")).startswith(PROBE_REQUEST_ID)


async def _clear(event: asyncio.Event) -> None:
    event.clear()


class VLLMWireServer:
    """`with VLLMWireServer(tiny, logprobs_mode="processed_logprobs") as server: server.url`."""

    def __init__(
        self,
        engine: Engine,
        *,
        model: str = "tiny",
        max_model_len: int | None = None,
        logprobs_mode: str = "raw_logprobs",
        generation_config: dict[str, Any] | None = None,
        dev_mode: bool = False,
        eos_token_id: int | None = None,
        token_ids_in_logprobs: bool = True,
    ) -> None:
        self.engine = engine
        self.model = model
        self.max_model_len = max_model_len or engine.max_context
        self.logprobs_mode = logprobs_mode
        self.token_ids_in_logprobs = token_ids_in_logprobs
        self.generation_config = dict(generation_config or {})
        # The model's EOS ends every generation (vLLM adds it to each request's stops).
        self.eos_token_id = engine.tokenizer.eos_token_id if eos_token_id is None else eos_token_id
        self.served: list[ServedRequest] = []
        self.control: list[tuple[str, Any]] = []  # dev-mode calls: (path, JSON body or None)
        self.dead = False
        self.overloaded = False
        self.health_delay_s = 0.0  # a busy server: /health answers late
        self.fail_after_tokens: int | None = None
        self.weight_version = "default"
        self.paused: str | None = None  # the pause mode while paused
        self.hold_after_tokens: int | None = None  # deliver that many, then wait for release()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._resumed: asyncio.Event | None = None  # both created on the server's loop
        self._released: asyncio.Event | None = None
        routes = [
            Route("/health", self._health),
            Route("/v1/models", self._models),
            Route("/v1/completions", self._completions, methods=["POST"]),
        ]
        if dev_mode:
            routes += [Route(path, handler, methods=[method]) for path, method, handler in (
                ("/pause", "POST", self._pause), ("/resume", "POST", self._resume),
                ("/is_paused", "GET", self._is_paused),
                ("/start_weight_update", "POST", self._ok("Weight update started")),
                ("/update_weights", "POST", self._update_weights),
                ("/finish_weight_update", "POST", self._finish_weight_update),
                ("/update_weight_version", "POST", self._update_weight_version),
                ("/weight_info", "GET", self._weight_info),
                ("/reset_prefix_cache", "POST", self._reset_prefix_cache),
                ("/get_world_size", "GET", self._world_size),
            )]
        self.app = Starlette(routes=routes)
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._socket.getsockname()[1]}"
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def calls(self) -> list[ServedRequest]:
        """The served requests that were model calls (the engine's probes left out)."""
        return [r for r in self.served if not r.is_probe]

    def reset(self) -> None:
        """Back to a fresh, healthy server (between tests)."""
        self.served.clear()
        self.control.clear()
        self.dead = self.overloaded = False
        self.health_delay_s = 0.0
        self.fail_after_tokens = self.hold_after_tokens = None
        self.weight_version = "default"
        self.paused = None
        self.release()
        if self._loop is not None and self._resumed is not None:
            self._loop.call_soon_threadsafe(self._resumed.set)

    def hold(self, after_tokens: int) -> None:
        """Streams deliver `after_tokens` tokens, then wait for `release()` (a slow generation
        that a test can act during). The engine's probes are never held: a server held before
        an engine starts still lets it start."""
        self.hold_after_tokens = after_tokens
        if self._loop is not None and self._released is not None:
            asyncio.run_coroutine_threadsafe(_clear(self._released), self._loop).result(5)

    def release(self) -> None:
        """Let streams held by `hold()` go on (from any thread)."""
        if self._loop is not None and self._released is not None:
            self._loop.call_soon_threadsafe(self._released.set)

    # -- OpenAI-compatible routes ---------------------------------------------------------

    async def _health(self, _: Request) -> Response:
        await asyncio.sleep(self.health_delay_s)
        return Response(status_code=503 if self.dead else 200)

    async def _models(self, _: Request) -> JSONResponse:
        card = {
            "id": self.model, "object": "model", "created": int(time.time()), "owned_by": "vllm",
            "root": self.model, "parent": None, "max_model_len": self.max_model_len,
            "permission": [],
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def _completions(self, request: Request) -> Response:
        body = await request.json()
        record = ServedRequest(body, peer=request.client.port if request.client else None)
        self.served.append(record)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
            prompt = prompt[0]
        if not (isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt)):
            return self._error(record, 400, "this fake takes `prompt` as a list of token ids")
        refusal = self._refusal(record, body, prompt)
        if refusal is not None:
            return refusal
        if self.paused in ("abort", "wait") and not body.get("stream"):
            return self._error(record, 503, PAUSED_MESSAGE, "ServiceUnavailableError")
        rid = str(body.get("request_id") or uuid.uuid4().hex)
        head = {"id": f"cmpl-{rid}", "object": "text_completion", "created": int(time.time()),
                "model": self.model}
        if body.get("stream"):
            return StreamingResponse(self._sse(record, prompt, head),
                                     media_type="text/event-stream")
        return JSONResponse(await self._whole(record, prompt, head))

    def _refusal(self, record: ServedRequest, body: dict, prompt: list[int]) -> Response | None:
        """vLLM's checks before sampling, in its order; fills `record.effective`."""
        model = body.get("model")
        if model and model != self.model:
            return self._error(record, 404, f"The model `{model}` does not exist. Valid aliases: "
                               f"{self.model}.", "NotFoundError", "model")
        if self.dead:
            return self._error(record, 500, DEAD_MESSAGE, "InternalServerError")
        if self.overloaded:
            return self._error(record, 503, BUSY_MESSAGE, "Service Unavailable")
        limit = self.max_model_len
        asked = body.get("max_tokens")
        asked = 16 if asked is None else int(asked)  # `normalize_null_max_tokens`
        if asked > limit:
            return self._error(record, 400, f"max_tokens={asked} cannot be greater than "
                               f"max_model_len={limit}. Please request fewer output tokens.",
                               param="max_tokens")
        if len(prompt) > limit:
            return self._error(record, 400, (
                f"This model's maximum context length is {limit} tokens. However, your prompt "
                f"contains {len(prompt)} input tokens, which exceeds this limit even without any "
                "output tokens. Please reduce the length of the input prompt."),
                param="input_tokens")
        record.max_tokens = min(limit - len(prompt), asked)
        if record.max_tokens < 1:
            return self._error(record, 400, f"max_tokens must be at least 1, got "
                               f"{record.max_tokens}.", param="max_tokens")
        defaults = self.generation_config
        record.effective = {
            name: body[name] if body.get(name) is not None else defaults.get(name, neutral)
            for name, neutral in VLLM_NEUTRAL.items()
        }
        skip = body.get("skip_special_tokens")
        record.effective["skip_special_tokens"] = (
            defaults.get("skip_special_tokens", True) if skip is None else skip)
        temperature = float(record.effective["temperature"])
        if not 0.0 <= temperature <= 2.0:
            return self._error(record, 400, f"temperature must be in [0, 2], got {temperature}.",
                               param="temperature")
        return None

    # -- sampling -------------------------------------------------------------------------

    async def _choices(self, record: ServedRequest, prompt: list[int]):
        """`CompletionResponseStreamChoice`s as dicts, one per engine chunk."""
        body, effective = record.body, record.effective
        tokenizer = self.engine.tokenizer
        want_ids = bool(body.get("return_token_ids"))
        as_ids = bool(body.get("return_tokens_as_token_ids")) and self.token_ids_in_logprobs
        want_logprobs = body.get("logprobs") is not None
        stops = tuple(body.get("stop_token_ids") or ())
        sampling = SamplingParams(
            temperature=float(effective["temperature"]), top_p=float(effective["top_p"]),
            top_k=max(int(effective["top_k"]), 0), max_tokens=record.max_tokens or 1,
            seed=body.get("seed"), stop_token_ids=(*stops, self.eos_token_id))
        offset = 0
        starts: list[tuple[str, int]] = []  # (label, first token index) per weight version
        stream = self.engine.stream(prompt, sampling)
        try:
            async for chunk in stream:
                if self.hold_after_tokens is not None and not record.is_probe and \
                        len(record.token_ids) >= self.hold_after_tokens:
                    assert self._released is not None
                    await self._released.wait()
                if self.paused == "keep":
                    await self._wait_resumed()
                if self.paused == "abort":
                    chunk.token_ids, chunk.logprobs, chunk.finish_reason = [], [], "abort"
                if self.fail_after_tokens is not None and \
                        len(record.token_ids) >= self.fail_after_tokens:
                    raise ConnectionAbortedError("fail_after_tokens: dropping the connection")
                ids = list(chunk.token_ids)
                values = list(chunk.logprobs)
                if self.logprobs_mode != "processed_logprobs" and ids:
                    values = await self.engine.ascore(prompt + record.token_ids, ids)
                if ids and (not starts or starts[-1][0] != self.weight_version):
                    starts.append((self.weight_version, len(record.token_ids)))
                record.token_ids += ids
                record.logprobs += values
                finish = chunk.finish_reason
                stop_reason = None
                if finish == "stop" and ids and ids[-1] != self.eos_token_id and ids[-1] in stops:
                    stop_reason = ids[-1]
                shown = ids
                if finish == "stop" and not body.get("include_stop_str_in_output"):
                    shown = ids[:-1]  # the stop token is in the ids, not in the text
                text = tokenizer.decode(shown, skip_special_tokens=effective[
                    "skip_special_tokens"])
                logprobs = None
                if want_logprobs:
                    pieces = [f"token_id:{t}" if as_ids else tokenizer.decode([t]) for t in ids]
                    offsets = []
                    for piece in pieces:
                        offsets.append(offset)
                        offset += len(piece)
                    logprobs = {"text_offset": offsets, "token_logprobs": values,
                                "tokens": pieces,
                                "top_logprobs": [{p: v} for p, v in zip(pieces, values)]}
                spans = None
                if finish is not None and body.get("return_weight_versions"):
                    ends = [s for _, s in starts[1:]] + [len(record.token_ids)]
                    spans = [{"version": v, "start": s, "end": e}
                             for (v, s), e in zip(starts, ends)]
                    record.weight_versions = spans
                record.text += text
                record.finish_reason, record.stop_reason = finish, stop_reason
                yield {
                    "index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish,
                    "stop_reason": stop_reason,
                    "prompt_token_ids": prompt if want_ids and len(record.chunks) == 0 else None,
                    "token_ids": ids if want_ids else None, "weight_versions": spans,
                }
                if finish is not None:
                    return
        finally:
            await stream.aclose()

    async def _sse(self, record: ServedRequest, prompt: list[int], head: dict):
        if self.paused in ("abort", "wait"):
            # Rejected inside the engine core, after the 200 went out (`RetryableRequestError`).
            error = {"error": {"message": PAUSED_MESSAGE, "type": "ServiceUnavailableError",
                               "param": None, "code": 503}}
            yield f"data: {json.dumps(error)}\n\n"
            yield "data: [DONE]\n\n"
            return
        async for choice in self._choices(record, prompt):
            chunk = {**head, "choices": [choice], "kv_transfer_params": None}
            record.chunks.append(chunk)
            yield f"data: {json.dumps(chunk)}\n\n"
        options = record.body.get("stream_options") or {}
        if options.get("include_usage"):
            n = len(record.token_ids)
            usage = {"prompt_tokens": len(prompt), "total_tokens": len(prompt) + n,
                     "completion_tokens": n}
            yield f"data: {json.dumps({**head, 'choices': [], 'usage': usage})}\n\n"
        yield "data: [DONE]\n\n"

    async def _whole(self, record: ServedRequest, prompt: list[int], head: dict) -> dict:
        want_ids = bool(record.body.get("return_token_ids"))
        choice: dict[str, Any] = {"index": 0, "text": "", "logprobs": None}
        async for part in self._choices(record, prompt):
            choice["text"] += part["text"]
            if part["logprobs"] is not None:
                merged = choice["logprobs"] or {k: [] for k in part["logprobs"]}
                choice["logprobs"] = {k: merged[k] + part["logprobs"][k] for k in merged}
            choice.update(finish_reason=part["finish_reason"], stop_reason=part["stop_reason"],
                          weight_versions=part["weight_versions"])
        choice.update(token_ids=record.token_ids if want_ids else None, prompt_logprobs=None,
                      prompt_token_ids=prompt if want_ids else None, routed_experts=None)
        n = len(record.token_ids)
        usage = {"prompt_tokens": len(prompt), "total_tokens": len(prompt) + n,
                 "completion_tokens": n, "prompt_tokens_details": None}
        return {**head, "choices": [choice], "service_tier": None, "system_fingerprint": None,
                "usage": usage, "kv_transfer_params": None, "ec_transfer_params": None,
                "metrics": None}

    def _error(self, record: ServedRequest, status: int, message: str,
               kind: str = "BadRequestError", param: str | None = None) -> JSONResponse:
        record.status, record.error = status, message
        return JSONResponse(
            {"error": {"message": message, "type": kind, "param": param, "code": status}},
            status_code=status,
        )

    # -- dev-mode routes (weight updates) -------------------------------------------------

    async def _wait_resumed(self) -> None:
        assert self._resumed is not None
        await self._resumed.wait()

    async def _json(self, request: Request) -> Any:
        raw = await request.body()
        payload = json.loads(raw) if raw.strip() else None
        self.control.append((request.url.path, payload))
        return payload

    def _ok(self, message: str):
        async def handler(request: Request) -> JSONResponse:
            await self._json(request)
            return JSONResponse({"message": message})
        return handler

    async def _pause(self, request: Request) -> JSONResponse:
        await self._json(request)
        mode = request.query_params.get("mode", "abort")
        if mode not in ("abort", "wait", "keep"):
            return JSONResponse({"error": f"invalid pause mode {mode!r}"}, status_code=400)
        assert self._resumed is not None
        self._resumed.clear()
        self.paused = mode
        return JSONResponse({"status": "paused"})

    async def _resume(self, request: Request) -> JSONResponse:
        await self._json(request)
        self.paused = None
        if self._resumed is not None:
            self._resumed.set()
        return JSONResponse({"status": "resumed"})

    async def _is_paused(self, _: Request) -> JSONResponse:
        return JSONResponse({"is_paused": self.paused is not None})

    async def _update_weights(self, request: Request) -> JSONResponse:
        payload = await self._json(request)
        if not isinstance(payload, dict) or "update_info" not in payload:
            return self._validation_error("update_info")
        return JSONResponse({"message": "Weights updated"})

    async def _finish_weight_update(self, request: Request) -> JSONResponse:
        # `weight_version: Annotated[str | None, Body(embed=True)] = None`: no body, `{}` or
        # null leave the label as it was (`AsyncLLM.finish_weight_update`).
        payload = await self._json(request)
        version = payload.get("weight_version") if isinstance(payload, dict) else None
        if version is not None:
            if not isinstance(version, str):
                return self._validation_error("weight_version")
            self.weight_version = version
        return JSONResponse({"message": "Weight update finished"})

    async def _update_weight_version(self, request: Request) -> JSONResponse:
        payload = await self._json(request)
        version = payload.get("new_version") if isinstance(payload, dict) else None
        if not isinstance(version, str):  # `new_version: str`, required, no coercion
            return self._validation_error("new_version")
        self.weight_version = version
        return JSONResponse({"success": True, "new_version": version})

    async def _weight_info(self, _: Request) -> JSONResponse:
        return JSONResponse({"weight_version": self.weight_version})

    async def _reset_prefix_cache(self, request: Request) -> JSONResponse:
        await self._json(request)
        return JSONResponse({"success": True})

    async def _world_size(self, _: Request) -> JSONResponse:
        return JSONResponse({"world_size": 1})

    def _validation_error(self, name: str) -> JSONResponse:
        return JSONResponse({"error": {"message": f"1 validation error:\n  body.{name}",
                                       "type": "BadRequestError", "param": f"body.{name}",
                                       "code": 400}}, status_code=400)

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> VLLMWireServer:
        config = uvicorn.Config(self.app, log_level="critical", lifespan="off", access_log=False,
                                timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._socket.listen(128)
        ready = threading.Event()

        async def serve() -> None:
            self._loop = asyncio.get_running_loop()
            self._resumed, self._released = asyncio.Event(), asyncio.Event()
            self._resumed.set()
            task = asyncio.ensure_future(self._server.serve(sockets=[self._socket]))
            while not self._server.started and not task.done():
                await asyncio.sleep(0.005)
            ready.set()
            await task

        self._thread = threading.Thread(target=lambda: asyncio.run(serve()), daemon=True,
                                        name="vllm-wire-server")
        self._thread.start()
        if not ready.wait(30):
            raise RuntimeError("the vLLM fake did not start")
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)
        self._socket.close()

    def __enter__(self) -> VLLMWireServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
