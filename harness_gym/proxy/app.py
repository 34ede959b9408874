"""The proxy's HTTP surface (an ASGI app): dialect routes plus the admin routes.

Dialect routes authenticate with a session key (`Authorization: Bearer KEY` or `x-api-key`);
admin routes (`/sessions`, `/health`) with the optional admin key. Every failure is answered in
the dialect the caller speaks, never as a bare 500 page.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..engines.base import Engine
from . import openai_chat
from .errors import ProxyError
from .model_call import CallFinished, ProxySettings, prepare_call
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
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/models", self.models, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/sessions", self.create_session, methods=["POST"]),
            Route("/sessions/{session_id}/trace", self.session_trace, methods=["GET"]),
            Route("/sessions/{session_id}", self.delete_session, methods=["DELETE"]),
            Route("/", self.root, methods=["GET", "HEAD"]),
        ]
        self.asgi = Starlette(routes=routes)

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
