"""The proxy's HTTP surface (an ASGI app): dialect routes plus the admin routes.

Dialect routes authenticate with a session key (`Authorization: Bearer KEY` or `x-api-key`);
admin routes (`/sessions`, `/health`) with the optional admin key. Every failure is answered in
the dialect the caller speaks, never as a bare 500 page.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.background import BackgroundTask
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..engines.base import Engine
from . import anthropic_messages, openai_chat, openai_responses
from .errors import ProxyError
from .canonical import ChatRequest
from .events import AnswerWriter, KeepAlive
from .model_call import PreparedCall, ProxySettings, prepare_call
from .sessions import ProxySession, SessionRegistry
from .wire import field, parse_json_body

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Dialect:
    """What differs between the wire formats; everything else is shared."""

    parse: Callable[[dict[str, Any]], ChatRequest]
    writer: Callable[[str, ChatRequest, int], AnswerWriter]  # (model, request, prompt_tokens)
    error_body: Callable[[ProxyError], dict[str, Any]]
    error_status: Callable[[ProxyError], int]

    def error_response(self, error: ProxyError) -> Response:
        return JSONResponse(self.error_body(error), status_code=self.error_status(error))


OPENAI_CHAT = Dialect(
    parse=openai_chat.parse_chat_request,
    writer=lambda model, chat, _: openai_chat.ChatWriter(model, chat.include_usage),
    error_body=openai_chat.error_body,
    error_status=lambda error: error.status,
)
ANTHROPIC_MESSAGES = Dialect(
    parse=anthropic_messages.parse_messages_request,
    writer=lambda model, _, prompt_tokens: anthropic_messages.MessageWriter(model, prompt_tokens),
    error_body=anthropic_messages.error_body,
    error_status=anthropic_messages.error_status,
)
OPENAI_RESPONSES = Dialect(
    parse=openai_responses.parse_responses_request,
    writer=lambda model, chat, _: openai_responses.ResponseWriter(model, chat),
    error_body=openai_chat.error_body,
    error_status=lambda error: error.status,
)


def session_key(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return request.headers.get("x-api-key")


class ProxyApp:
    """Holds what the routes need; `asgi` is the Starlette application."""

    def __init__(
        self,
        engine: Engine,
        sessions: SessionRegistry,
        *,
        settings: ProxySettings | None = None,
        admin_key: str | None = None,
        base_url: str = "",
    ) -> None:
        self.engine = engine
        self.sessions = sessions
        self.settings = settings or ProxySettings()
        self.admin_key = admin_key
        self.base_url = base_url
        routes = [
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/v1/messages", self.messages, methods=["POST"]),
            Route("/v1/messages/count_tokens", self.count_tokens, methods=["POST"]),
            Route("/v1/responses", self.responses, methods=["POST"]),
            Route("/responses", self.responses, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/models", self.models, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/sessions", self.create_session, methods=["POST"]),
            Route("/sessions/{session_id}/trace", self.session_trace, methods=["GET"]),
            Route("/sessions/{session_id}", self.delete_session, methods=["DELETE"]),
            Route("/", self.root, methods=["GET", "HEAD"]),
        ]
        self.asgi = Starlette(
            routes=routes,
            exception_handlers={404: self._unknown_route, 405: self._unknown_route},
        )

    # --- dialect routes -----------------------------------------------------------------

    def _session(self, request: Request) -> ProxySession:
        key = session_key(request)
        if not key:
            raise ProxyError(
                "authentication", "You didn't provide an API key: send the session key as a "
                "Bearer token or in x-api-key."
            )
        return self.sessions.get(key)

    async def _dialect_call(self, request: Request, dialect: Dialect) -> Response:
        """Every dialect route: parse into the canonical request, run one model call, answer
        as SSE or JSON through the dialect's writer, and shape every error the dialect's way."""
        try:
            session = self._session(request)
            session.acquire_call_slot(self.settings.max_calls_in_flight_per_session)
        except ProxyError as error:
            return dialect.error_response(error)
        streaming = False
        try:
            chat = dialect.parse(parse_json_body(await self._body(request)))
            call = await prepare_call(session, self.engine, chat, self.settings)
            writer = dialect.writer(chat.model or self.engine.model_name, chat, call.prompt_tokens)
            if chat.stream:
                streaming = True
                return StreamingResponse(
                    self._stream(call, writer), media_type="text/event-stream",
                    headers={"cache-control": "no-cache"},
                    # Runs when the response ends, also when the client left before the first
                    # byte (then the stream above never started and its cleanup never ran).
                    background=BackgroundTask(self._end_stream, session, call),
                )
            async for event in call.events():
                if not isinstance(event, KeepAlive):
                    writer.feed(event)
            return JSONResponse(writer.body())
        except ProxyError as error:
            return dialect.error_response(error)
        except Exception as exc:  # the engine failed mid-call; the call is recorded aborted
            return dialect.error_response(ProxyError("overloaded", f"the engine failed: {exc}"))
        finally:
            if not streaming:  # a stream releases its slot when it ends
                session.release_call_slot()

    async def _body(self, request: Request) -> bytes:
        limit = self.settings.max_body_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise ProxyError("too_large", f"Request body of {declared} bytes exceeds {limit}.")
        body = await request.body()
        if len(body) > limit:
            raise ProxyError("too_large", f"Request body of {len(body)} bytes exceeds {limit}.")
        return body

    @staticmethod
    async def _stream(call: PreparedCall, writer: AnswerWriter) -> AsyncIterator[bytes]:
        yield writer.start()
        try:
            async for event in call.events():
                chunk = writer.keepalive() if isinstance(event, KeepAlive) else writer.feed(event)
                if chunk:
                    yield chunk
        except Exception as exc:  # the engine failed mid-stream; the call is recorded aborted
            log.warning("stream aborted: %s", exc)
            yield writer.error_event(
                exc if isinstance(exc, ProxyError) else ProxyError("overloaded", str(exc))
            )

    @staticmethod
    async def _end_stream(session: ProxySession, call: PreparedCall) -> None:
        await call.discard_if_unconsumed()
        session.release_call_slot()

    async def chat_completions(self, request: Request) -> Response:
        return await self._dialect_call(request, OPENAI_CHAT)

    async def messages(self, request: Request) -> Response:
        """Anthropic Messages (`/v1/messages`, Claude Code adds `?beta=true`)."""
        return await self._dialect_call(request, ANTHROPIC_MESSAGES)

    async def responses(self, request: Request) -> Response:
        """OpenAI Responses (`/v1/responses`), stateless: the whole history comes in `input`."""
        return await self._dialect_call(request, OPENAI_RESPONSES)

    async def count_tokens(self, request: Request) -> Response:
        """The prompt's real token count, as the bridge would build it; nothing is recorded."""
        try:
            session = self._session(request)
            chat = anthropic_messages.parse_messages_request(
                parse_json_body(await request.body()), require_max_tokens=False
            )
        except ProxyError as error:
            return ANTHROPIC_MESSAGES.error_response(error)
        plan = await anyio.to_thread.run_sync(session.bridge.plan, chat)
        return JSONResponse({"input_tokens": len(plan.prompt_ids)})

    async def models(self, request: Request) -> Response:
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.engine.model_name,
                        "object": "model",
                        "created": 0,
                        "owned_by": "harness-gym",
                        "max_model_len": self.engine.max_context,
                    }
                ],
            }
        )

    def _openai_error(self, error: ProxyError) -> Response:
        return OPENAI_CHAT.error_response(error)

    async def _unknown_route(self, request: Request, exc: Exception) -> Response:
        # CLIs probe paths we do not serve (Hermes: `GET /api/v1/models`): a quiet 404.
        if request.method == "HEAD":
            return Response(status_code=404)
        error = ProxyError("not_found", f"Unknown route: {request.method} {request.url.path}")
        return self._openai_error(error)

    async def root(self, request: Request) -> Response:
        # Claude Code sends `HEAD /` before its first call.
        return Response(status_code=200)

    # --- admin routes -------------------------------------------------------------------

    def _check_admin(self, request: Request) -> None:
        if self.admin_key is not None and session_key(request) != self.admin_key:
            raise ProxyError("authentication", "admin routes need the proxy's admin key")

    async def health(self, request: Request) -> Response:
        return JSONResponse(
            {"status": "ok", "model": self.engine.model_name, "sessions": len(self.sessions)}
        )

    async def create_session(self, request: Request) -> Response:
        try:
            self._check_admin(request)
            raw = await request.body()
            body = parse_json_body(raw) if raw.strip() else {}
            version = field(body, "policy_version", int, "policy_version")
            session = self.sessions.open(
                version,
                field(body, "sampling", dict, "sampling"),
                field(body, "context_overflow", str, "context_overflow", default="error"),
            )
        except ProxyError as error:
            return self._openai_error(error)
        return JSONResponse(
            {"session_id": session.session_id, "api_key": session.session_id,
             "base_url": self.base_url},
            status_code=201,
        )

    async def session_trace(self, request: Request) -> Response:
        try:
            self._check_admin(request)
            session_id = request.path_params["session_id"]
            session = self.sessions.find(session_id)
            if session is None:
                raise ProxyError("not_found", f"session {session_id!r} is not open")
        except ProxyError as error:
            return self._openai_error(error)
        return JSONResponse(session.trace_json())

    async def delete_session(self, request: Request) -> Response:
        try:
            self._check_admin(request)
            session = self.sessions.close(request.path_params["session_id"])
        except ProxyError as error:
            return self._openai_error(error)
        return JSONResponse(session.trace_json())
