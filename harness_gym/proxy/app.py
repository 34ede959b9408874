"""The proxy's HTTP surface (an ASGI app): dialect routes plus the admin routes.

Dialect routes authenticate with a session key (`Authorization: Bearer KEY` or `x-api-key`;
Gemini's also `x-goog-api-key` or `?key=`) and reach only that session; the admin routes
(`/sessions...`) take only the admin key (a session key gets a 403, so an agent can neither
open, read nor close any session, its own included).
Every failure is answered in the dialect the caller speaks, never as a bare 500 page.

A request's body is read within the byte limit, then parsed, checked against the message and
tool caps and turned into prompt ids in a worker thread, so a large request never stalls the
event loop that streams other sessions' answers; at most two large ones are worked on at once.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..engines.base import Engine
from . import anthropic_messages, gemini, openai_chat, openai_responses
from .bridge import PromptPlan
from .canonical import ChatRequest
from .errors import ProxyError, invalid
from .events import AnswerWriter, KeepAlive
from .message_cache import MessageParseCache
from .model_call import PreparedCall, plan_prompt, prompt_budget, start_call
from .rendering import PromptTooLong
from .request_limits import ClientGone, check_counts, check_message_count, read_body
from .sessions import ProxySession, SessionRegistry
from .settings import ProxySettings
from .wire import field, parse_json_body

log = logging.getLogger(__name__)


def session_key(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return request.headers.get("x-api-key")


def google_key(request: Request) -> str | None:
    """Google's clients send the key in `x-goog-api-key`, or as `?key=`."""
    return (request.headers.get("x-goog-api-key") or request.query_params.get("key")
            or session_key(request))


@dataclass(frozen=True)
class Dialect:
    """What differs between the wire formats; everything else is shared."""

    parse: Callable[[dict[str, Any], MessageParseCache], ChatRequest]  # (body, the session's)
    items_param: str  # the body's list of messages (input items), capped at max_messages
    writer: Callable[[str, ChatRequest, int], AnswerWriter]  # (model, request, prompt_tokens)
    error_body: Callable[[ProxyError], dict[str, Any]]
    error_status: Callable[[ProxyError], int]
    key: Callable[[Request], str | None] = session_key  # where the session key is sent

    def error_response(self, error: ProxyError) -> Response:
        return JSONResponse(self.error_body(error), status_code=self.error_status(error))


OPENAI_CHAT = Dialect(
    parse=openai_chat.parse_chat_request,
    items_param="messages",
    writer=lambda model, chat, _: openai_chat.ChatWriter(model, chat.include_usage),
    error_body=openai_chat.error_body,
    error_status=lambda error: error.status,
)
ANTHROPIC_MESSAGES = Dialect(
    parse=anthropic_messages.parse_messages_request,
    items_param="messages",
    writer=lambda model, _, prompt_tokens: anthropic_messages.MessageWriter(model, prompt_tokens),
    error_body=anthropic_messages.error_body,
    error_status=anthropic_messages.error_status,
)
OPENAI_RESPONSES = Dialect(
    # No session cache: an input item's meaning depends on the items before it (reasoning
    # waits for its assistant turn), so items are not parsed one by one.
    parse=lambda body, _cache: openai_responses.parse_responses_request(body),
    items_param="input",
    writer=lambda model, chat, _: openai_responses.ResponseWriter(model, chat),
    error_body=openai_chat.error_body,
    error_status=lambda error: error.status,
)


COUNT_TOKENS = Dialect(
    parse=lambda body, cache: anthropic_messages.parse_messages_request(
        body, cache, require_max_tokens=False),
    items_param="messages",
    writer=ANTHROPIC_MESSAGES.writer,
    error_body=anthropic_messages.error_body,
    error_status=anthropic_messages.error_status,
)
LARGE_BODY_BYTES = 1024 * 1024  # bodies above this share a small pool of workers
LARGE_REQUESTS_AT_ONCE = 2
ADMIN_BODY_BYTES = 64 * 1024  # POST /sessions takes a few fields


def gemini_dialect(model: str, stream: bool) -> Dialect:
    """Gemini's `generateContent` / `streamGenerateContent`: the model and streaming come
    from the URL, so the record is made per request."""
    return Dialect(
        # No session cache: a functionResponse's id depends on the model turn before it.
        parse=lambda body, _cache: gemini.parse_generate_request(body, model=model,
                                                                 stream=stream),
        items_param="contents",
        writer=lambda model, _, prompt_tokens: gemini.GenerateWriter(model, prompt_tokens),
        error_body=gemini.error_body,
        error_status=gemini.error_status,
        key=google_key,
    )


GEMINI_ERRORS = gemini_dialect("", False)


class ProxyApp:
    """Holds what the routes need; `asgi` is the Starlette application."""

    def __init__(
        self,
        engine: Engine,
        sessions: SessionRegistry,
        *,
        admin_key: str | None,
        settings: ProxySettings | None = None,
        base_url: str = "",
    ) -> None:
        # `admin_key=None` leaves the admin routes open (only `harness-gym serve` on loopback
        # does that, as the public contract allows); a session key is refused either way.
        self.engine = engine
        self.sessions = sessions
        self.settings = settings or ProxySettings()
        self.admin_key = admin_key
        self.base_url = base_url
        self._large_requests: anyio.CapacityLimiter | None = None  # made on the loop
        routes = [
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/v1/messages", self.messages, methods=["POST"]),
            Route("/v1/messages/count_tokens", self.count_tokens, methods=["POST"]),
            Route("/v1/responses", self.responses, methods=["POST"]),
            Route("/responses", self.responses, methods=["POST"]),
            Route("/v1beta/models/{target:path}", self.gemini, methods=["POST"]),
            Route("/v1/models/{target:path}", self.gemini, methods=["POST"]),  # Gemini's v1
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

    def _session(self, request: Request, dialect: Dialect | None = None) -> ProxySession:
        key = (dialect.key if dialect is not None else session_key)(request)
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
            session = self._session(request, dialect)
            session.acquire_call_slot(self.settings.max_calls_in_flight_per_session)
        except ProxyError as error:
            return dialect.error_response(error)
        streaming = False
        try:
            started = time.perf_counter()
            chat, plan = await self._parse_and_plan(request, dialect, session)
            call = await start_call(session, self.engine, chat, plan, self.settings, started)
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
        except ClientGone:
            return Response(status_code=400)  # nobody is left to read it
        except Exception as exc:  # the engine failed mid-call; the call is recorded aborted
            return dialect.error_response(ProxyError("overloaded", f"the engine failed: {exc}"))
        finally:
            if not streaming:  # a stream releases its slot when it ends
                session.release_call_slot()

    async def _parse_and_plan(
        self, request: Request, dialect: Dialect, session: ProxySession
    ) -> tuple[ChatRequest, PromptPlan]:
        raw = await read_body(request, self.settings.max_body_bytes)

        def work() -> tuple[ChatRequest, PromptPlan]:
            chat = self._parse(raw, dialect, session)
            return chat, plan_prompt(session, self.engine, chat, self.settings)

        return await self._off_loop(work, len(raw))

    def _parse(self, raw: bytes, dialect: Dialect, session: ProxySession) -> ChatRequest:
        body = parse_json_body(raw)
        check_counts(body, dialect.items_param, self.settings)
        chat = dialect.parse(body, session.parsed_messages)
        check_message_count(chat, self.settings)
        return chat

    async def _off_loop(self, work: Callable[[], Any], size: int) -> Any:
        """Run CPU-bound request work in a worker thread; large requests queue for a small
        pool, so a burst of them bounds the memory they take."""
        limiter = None
        if size > LARGE_BODY_BYTES:
            if self._large_requests is None:
                self._large_requests = anyio.CapacityLimiter(LARGE_REQUESTS_AT_ONCE)
            limiter = self._large_requests
        return await anyio.to_thread.run_sync(work, limiter=limiter)

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
        """Anthropic's `/v1/messages/count_tokens`."""
        return await self._count_tokens(request, COUNT_TOKENS, lambda n: {"input_tokens": n})

    async def gemini(self, request: Request) -> Response:
        """Gemini's `/v1beta/models/{model}:{method}`; streams only as SSE (`?alt=sse`, what
        both Google SDKs ask for)."""
        model, _, method = request.path_params["target"].rpartition(":")
        if not model or method not in gemini.METHODS:
            return GEMINI_ERRORS.error_response(ProxyError(
                "not_found", f"Unknown method {method!r} for models/{model}: this proxy serves "
                f"{', '.join(gemini.METHODS)}."))
        if method == "countTokens":
            dialect = replace(gemini_dialect(model, False), parse=lambda body, _cache: (
                gemini.parse_count_request(body, model=model)))
            return await self._count_tokens(request, dialect, gemini.count_body)
        stream = method == "streamGenerateContent"
        if stream and request.query_params.get("alt") != "sse":
            return GEMINI_ERRORS.error_response(invalid(
                "streamGenerateContent is served as server-sent events only: add ?alt=sse."))
        return await self._dialect_call(request, gemini_dialect(model, stream))

    async def _count_tokens(
        self, request: Request, dialect: Dialect, answer: Callable[[int], dict[str, Any]]
    ) -> Response:
        """The prompt's real token count, as the bridge would build it; nothing is recorded.
        A prompt far over the context is counted only until that is clear."""
        try:
            session = self._session(request, dialect)
            raw = await read_body(request, self.settings.max_body_bytes)
            budget = prompt_budget(self.engine)

            def count() -> int:
                chat = self._parse(raw, dialect, session)
                try:
                    return len(session.bridge.plan(chat, budget).prompt_ids)
                except PromptTooLong as exc:
                    return exc.prompt_tokens

            tokens = await self._off_loop(count, len(raw))
        except ProxyError as error:
            return dialect.error_response(error)
        except ClientGone:
            return Response(status_code=400)
        return JSONResponse(answer(tokens))

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

    def _is_admin(self, request: Request) -> bool:
        key = session_key(request) or ""
        if self.admin_key is None:
            return not self.sessions.is_session_key(key)
        return hmac.compare_digest(key.encode(), self.admin_key.encode())

    def _check_admin(self, request: Request) -> None:
        if self._is_admin(request):
            return
        key = session_key(request)
        if key and self.sessions.is_session_key(key):
            raise ProxyError(
                "forbidden", "A session key cannot use the admin routes (/sessions): they take "
                "the proxy's admin key."
            )
        raise ProxyError(
            "authentication", "The admin routes (/sessions) need the proxy's admin key, sent as "
            "a Bearer token or in x-api-key (harness-gym serve prints it at start)."
        )

    async def health(self, request: Request) -> Response:
        status = {"status": "ok", "model": self.engine.model_name}
        if self._is_admin(request):
            status["sessions"] = len(self.sessions)
        return JSONResponse(status)

    async def create_session(self, request: Request) -> Response:
        try:
            self._check_admin(request)
            raw = await read_body(request, ADMIN_BODY_BYTES)
            body = parse_json_body(raw) if raw.strip() else {}
            version = field(body, "policy_version", int, "policy_version")
            session = self.sessions.open(
                version,
                field(body, "sampling", dict, "sampling"),
                field(body, "context_overflow", str, "context_overflow", default="error"),
                field(body, "train_subagents", bool, "train_subagents", default=False),
            )
        except ProxyError as error:
            return self._openai_error(error)
        except ClientGone:
            return Response(status_code=400)
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
