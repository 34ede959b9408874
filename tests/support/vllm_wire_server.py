"""A stand-in vLLM server: vLLM 0.33's OpenAI completions wire protocol over the tiny model.

vLLM cannot run on this machine (its wheel is CUDA-only and pins its own torch), so the
`VLLMEngine` is tested against this real HTTP server (starlette + uvicorn on 127.0.0.1, port 0,
in a thread) that speaks the subset of the protocol the engine uses, with vLLM's field names and
shapes (`vllm/entrypoints/openai/protocol.py`):

- `GET /v1/models`: a `ModelList` whose card carries `max_model_len`; `GET /health`.
- `POST /v1/completions` (`CompletionRequest`): `prompt` as a list of token ids, `max_tokens`,
  `temperature`, `top_p`, `top_k` (-1 disables), `seed`, `stop_token_ids`, `logprobs`,
  `return_token_ids`, `stream`, `skip_special_tokens`, `include_stop_str_in_output`.
  Streamed answers are `CompletionStreamResponse` SSE chunks (`choices[0].token_ids`,
  `logprobs.token_logprobs`, `prompt_token_ids` on the first chunk, `finish_reason` on the last)
  ending with `data: [DONE]`; otherwise one `CompletionResponse`. A prompt that does not fit gets
  vLLM's 400 with its "maximum context length" message.

Sampling is the tiny engine's (processed logprobs, as with `--logprobs-mode processed_logprobs`).
Every request is recorded (`served`) with what was sent back, so a test can compare the engine's
output with the wire. Knobs for failure tests: `unavailable` (answer 503), `fail_after_tokens`
(drop the connection mid-stream), `policy_version` (sent as an `x-policy-version` header).
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


@dataclass
class ServedRequest:
    """One `/v1/completions` request and what the server sent back for it."""

    body: dict[str, Any]
    status: int = 200
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None


class VLLMWireServer:
    """`with VLLMWireServer(tiny) as server: server.url` -> `http://127.0.0.1:PORT`."""

    def __init__(self, engine: Engine, *, model: str = "tiny", max_model_len: int | None = None):
        self.engine = engine
        self.model = model
        self.max_model_len = max_model_len or engine.max_context
        self.served: list[ServedRequest] = []
        self.unavailable = False
        self.fail_after_tokens: int | None = None
        self.policy_version: int | None = None
        self.app = Starlette(routes=[
            Route("/health", lambda _: Response(status_code=200)),
            Route("/v1/models", self._models),
            Route("/v1/completions", self._completions, methods=["POST"]),
        ])
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._socket.getsockname()[1]}"
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    # -- routes -------------------------------------------------------------------------------

    async def _models(self, _: Request) -> JSONResponse:
        card = {
            "id": self.model, "object": "model", "created": int(time.time()), "owned_by": "vllm",
            "root": self.model, "parent": None, "max_model_len": self.max_model_len,
            "permission": [],
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def _completions(self, request: Request) -> Response:
        body = await request.json()
        record = ServedRequest(body)
        self.served.append(record)
        if self.unavailable:
            return self._error(record, 503, "the server is overloaded", "ServiceUnavailableError")
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
            prompt = prompt[0]
        if not (isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt)):
            return self._error(record, 400, "this stand-in takes `prompt` as a list of token ids")
        max_tokens = int(body.get("max_tokens") or 16)
        if len(prompt) + max_tokens > self.max_model_len:
            return self._error(record, 400, (
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"you requested {len(prompt) + max_tokens} tokens ({len(prompt)} in the messages, "
                f"{max_tokens} in the completion). Please reduce the length of the messages or "
                "completion."))
        top_k = int(body.get("top_k") or 0)
        sampling = SamplingParams(
            temperature=float(body.get("temperature", 1.0)), top_p=float(body.get("top_p", 1.0)),
            top_k=max(top_k, 0), max_tokens=max_tokens, seed=body.get("seed"),
            stop_token_ids=tuple(body.get("stop_token_ids") or ()),
        )
        chunks = self._choices(record, prompt, sampling, body)
        headers = {} if self.policy_version is None else {
            "x-policy-version": str(self.policy_version)}
        if body.get("stream"):
            return StreamingResponse(self._sse(chunks, record), media_type="text/event-stream",
                                     headers=headers)
        choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": None,
                  "stop_reason": None, "prompt_token_ids": None, "token_ids": None}
        async for part in chunks:
            choice["text"] += part["text"]
            for key in ("finish_reason", "stop_reason", "prompt_token_ids"):
                choice[key] = part[key] if part[key] is not None else choice[key]
            if part["token_ids"] is not None:
                choice["token_ids"] = (choice["token_ids"] or []) + part["token_ids"]
            if part["logprobs"] is not None:
                merged = choice["logprobs"] or {k: [] for k in part["logprobs"]}
                choice["logprobs"] = {k: merged[k] + part["logprobs"][k] for k in merged}
        usage = {"prompt_tokens": len(prompt), "completion_tokens": len(record.token_ids),
                 "total_tokens": len(prompt) + len(record.token_ids)}
        return JSONResponse(self._response(body, [choice], usage), headers=headers)

    async def _choices(self, record: ServedRequest, prompt: list[int], sampling: SamplingParams,
                       body: dict[str, Any]):
        """`CompletionResponseStreamChoice`s, one per engine chunk."""
        tokenizer = self.engine.tokenizer
        want_ids, want_logprobs = body.get("return_token_ids"), body.get("logprobs") is not None
        first = True
        offset = 0
        stream = self.engine.stream(prompt, sampling)
        try:
            async for chunk in stream:
                if self.fail_after_tokens is not None and \
                        len(record.token_ids) >= self.fail_after_tokens:
                    raise ConnectionAbortedError("fail_after_tokens: dropping the connection")
                record.token_ids.extend(chunk.token_ids)
                record.logprobs.extend(chunk.logprobs)
                pieces = [tokenizer.decode([t], skip_special_tokens=False) for t in chunk.token_ids]
                logprobs = None
                if want_logprobs:
                    logprobs = {
                        "text_offset": [offset + len("".join(pieces[:i]))
                                        for i in range(len(pieces))],
                        "token_logprobs": list(chunk.logprobs),
                        "tokens": pieces,
                        "top_logprobs": [{p: lp} for p, lp in zip(pieces, chunk.logprobs)],
                    }
                offset += sum(map(len, pieces))
                stop_reason = None
                if chunk.finish_reason == "stop" and chunk.token_ids and \
                        chunk.token_ids[-1] in (body.get("stop_token_ids") or ()):
                    stop_reason = chunk.token_ids[-1]
                record.finish_reason = chunk.finish_reason
                yield {
                    "index": 0, "text": "".join(pieces), "logprobs": logprobs,
                    "finish_reason": chunk.finish_reason, "stop_reason": stop_reason,
                    "prompt_token_ids": prompt if want_ids and first else None,
                    "token_ids": list(chunk.token_ids) if want_ids else None,
                }
                first = False
        finally:
            await stream.aclose()

    async def _sse(self, choices, record: ServedRequest):
        body = record.body
        async for choice in choices:
            yield f"data: {json.dumps(self._response(body, [choice], None))}\n\n"
        yield "data: [DONE]\n\n"

    def _response(self, body: dict[str, Any], choices: list[dict], usage: dict | None) -> dict:
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
                "created": int(time.time()), "model": body.get("model") or self.model,
                "choices": choices, "usage": usage}

    def _error(self, record: ServedRequest, status: int, message: str,
               kind: str = "BadRequestError") -> JSONResponse:
        record.status = status
        return JSONResponse(
            {"error": {"message": message, "type": kind, "param": None, "code": status}},
            status_code=status,
        )

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> VLLMWireServer:
        config = uvicorn.Config(self.app, log_level="critical", lifespan="off", access_log=False,
                                timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._socket.listen(128)
        ready = threading.Event()

        async def serve() -> None:
            task = asyncio.ensure_future(self._server.serve(sockets=[self._socket]))
            while not self._server.started and not task.done():
                await asyncio.sleep(0.005)
            ready.set()
            await task

        self._thread = threading.Thread(target=lambda: asyncio.run(serve()), daemon=True,
                                        name="vllm-wire-server")
        self._thread.start()
        if not ready.wait(30):
            raise RuntimeError("the vLLM stand-in did not start")
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
