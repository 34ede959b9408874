"""The proxy's HTTP surface (an ASGI app): dialect routes plus the admin routes.

Dialect routes authenticate with a session key (`Authorization: Bearer KEY` or `x-api-key`);
admin routes (`/sessions`, `/health`) with the optional admin key. Every failure is answered in
the dialect the caller speaks, never as a bare 500 page.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..engines.base import Engine
from . import anthropic_messages, openai_chat, openai_responses
from .errors import ProxyError
from .model_call import CallFinished, PreparedCall, ProxySettings, prepare_call
from .sessions import ProxySession, SessionRegistry
from .tool_parsers import TextDelta, ToolCallDone
from .wire import field, parse_json_body

log = logging.getLogger(__name__)


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

    async def chat_completions(self, request: Request) -> Response:
        try:
            session = self._session(request)
            chat = openai_chat.parse_chat_request(parse_json_body(await request.body()))
            call = await prepare_call(session, self.engine, chat, self.settings)
        except ProxyError as error:
            return self._openai_error(error)
        model = chat.model or self.engine.model_name
        if not chat.stream:
            try:
                done = await call.run()
            except ProxyError as error:
                return self._openai_error(error)
            return JSONResponse(
                openai_chat.chat_completion(
                    openai_chat.completion_id(), model, done.turn, done.prompt_tokens,
                    done.completion_tokens,
                )
            )
        return StreamingResponse(
            self._chat_stream(call, model, chat.include_usage),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache"},
        )

    async def _chat_stream(self, call: Any, model: str, include_usage: bool) -> AsyncIterator[bytes]:
        writer = openai_chat.ChatChunkWriter(model)
        yield writer.role()
        try:
            async for event in call.events():
                if isinstance(event, TextDelta):
                    yield writer.text(event.text)
                elif isinstance(event, ToolCallDone):
                    yield writer.tool_call(event.call)
                elif isinstance(event, CallFinished):
                    yield writer.finish(
                        event.turn, event.prompt_tokens, event.completion_tokens, include_usage
                    )
        except Exception as exc:  # the engine failed mid-stream; the call is recorded aborted
            log.warning("stream aborted: %s", exc)
            yield openai_chat.error_event(
                exc if isinstance(exc, ProxyError) else ProxyError("overloaded", str(exc))
            )

    async def messages(self, request: Request) -> Response:
        """Anthropic Messages (`/v1/messages`, Claude Code adds `?beta=true`)."""
        try:
            session = self._session(request)
            chat = anthropic_messages.parse_messages_request(
                parse_json_body(await request.body())
            )
            call = await prepare_call(session, self.engine, chat, self.settings)
        except ProxyError as error:
            return self._anthropic_error(error)
        writer = anthropic_messages.MessageWriter(
            chat.model or self.engine.model_name, call.prompt_tokens
        )
        if chat.stream:
            return self._sse(self._stream(call, writer, anthropic_messages.error_event))
        try:
            await self._drain(call, writer)
        except ProxyError as error:
            return self._anthropic_error(error)
        return JSONResponse(writer.message())

    async def count_tokens(self, request: Request) -> Response:
        """The prompt's real token count, as the bridge would build it; nothing is recorded."""
        try:
            session = self._session(request)
            chat = anthropic_messages.parse_messages_request(
                parse_json_body(await request.body()), require_max_tokens=False
            )
        except ProxyError as error:
            return self._anthropic_error(error)
        plan = await anyio.to_thread.run_sync(session.bridge.plan, chat)
        return JSONResponse({"input_tokens": len(plan.prompt_ids)})

    async def responses(self, request: Request) -> Response:
        """OpenAI Responses (`/v1/responses`), stateless: the whole history comes in `input`."""
        try:
            session = self._session(request)
            chat = openai_responses.parse_responses_request(parse_json_body(await request.body()))
            call = await prepare_call(session, self.engine, chat, self.settings)
        except ProxyError as error:
            return self._openai_error(error)
        writer = openai_responses.ResponseWriter(chat.model or self.engine.model_name, chat)
        if chat.stream:
            return self._sse(self._stream(call, writer, writer.error_events))
        try:
            await self._drain(call, writer)
        except ProxyError as error:
            return self._openai_error(error)
        return JSONResponse(writer.response())

    @staticmethod
    def _sse(events: AsyncIterator[bytes]) -> Response:
        return StreamingResponse(
            events, media_type="text/event-stream", headers={"cache-control": "no-cache"}
        )

    @staticmethod
    async def _drain(call: PreparedCall, writer: Any) -> None:
        """A non-streamed answer: the same writer as streaming, its bytes thrown away."""
        try:
            async for event in call.events():
                writer.feed(event)
        except ProxyError:
            raise
        except Exception as exc:  # the engine failed mid-call; the call is recorded aborted
            raise ProxyError("overloaded", f"the engine failed, retry later: {exc}") from None

    @staticmethod
    async def _stream(call: PreparedCall, writer: Any, error_event: Any) -> AsyncIterator[bytes]:
        yield writer.start()
        try:
            async for event in call.events():
                chunk = writer.feed(event)
                if chunk:
                    yield chunk
        except Exception as exc:  # the engine failed mid-stream; the call is recorded aborted
            log.warning("stream aborted: %s", exc)
            yield error_event(
                exc if isinstance(exc, ProxyError) else ProxyError("overloaded", str(exc))
            )

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
        return JSONResponse(openai_chat.error_body(error), status_code=error.status)

    def _anthropic_error(self, error: ProxyError) -> Response:
        return JSONResponse(
            anthropic_messages.error_body(error),
            status_code=anthropic_messages.error_status(error),
        )

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
            session = self.sessions.open(version, field(body, "sampling", dict, "sampling"))
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
