"""Sessions: one per rollout. The API key a CLI sends *is* the session id.

A session ends when its owner closes it or when it has had no call for `idle_timeout_s`
(a rollout whose owner crashed must not hold memory for ever); at most `max_sessions` are open
at once. A key of an ended session keeps getting a 401 that says why, and a call still running
when its session ends records nothing: the trace its owner took at close is the final one.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from ..engines.base import SamplingParams
from ..trace import SessionTrace
from .bridge import PromptBridge
from .canonical import SamplingRequest
from .errors import ProxyError, invalid
from .message_cache import MessageParseCache
from .reasoning import ReasoningFormat, ReasoningSigner
from .rendering import PromptRenderer

SAMPLING_KEYS = ("temperature", "top_p", "top_k", "max_tokens", "seed")
CONTEXT_OVERFLOW = ("error", "truncate")


def check_context_overflow(value: Any) -> str:
    if value not in CONTEXT_OVERFLOW:
        raise invalid(
            f"context_overflow must be one of {list(CONTEXT_OVERFLOW)}, got {value!r}",
            "context_overflow",
        )
    return value


def parse_session_sampling(raw: Any) -> dict[str, Any]:
    """Validate the trainer's sampling overrides for a session (POST /sessions)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise invalid("'sampling' must be an object", "sampling")
    unknown = set(raw) - set(SAMPLING_KEYS)
    if unknown:
        raise invalid(
            f"unknown sampling keys {sorted(unknown)}; known: {list(SAMPLING_KEYS)}", "sampling"
        )
    for key, value in raw.items():
        integral = key in ("top_k", "max_tokens", "seed")
        ok = isinstance(value, int) if integral else isinstance(value, (int, float))
        if isinstance(value, bool) or not ok:
            kind = "an integer" if integral else "a number"
            raise invalid(f"sampling.{key} must be {kind}", f"sampling.{key}")
    try:
        SamplingParams(**{k: v for k, v in raw.items() if k != "seed"})
    except ValueError as exc:
        raise invalid(f"sampling: {exc}", "sampling") from None
    return dict(raw)


@dataclass
class ProxySession:
    """A rollout's view of the proxy.

    Sampling precedence: the proxy's defaults, then what the request asks for, then the session's
    overrides (the trainer owns sampling; a CLI's own `temperature` must not change p_old's
    meaning). `max_tokens` from the session is a cap; the engine's context is the last word.
    """

    session_id: str
    renderer: PromptRenderer
    sampling: dict[str, Any] = field(default_factory=dict)
    policy_version: int | None = None
    # "error": a prompt that does not fit gets the dialect's context-too-long error (the CLI
    # compacts its own history). "truncate": the proxy blanks the oldest tool results until it
    # fits, records it, and starts a new segment.
    context_overflow: str = "error"
    # A sub-agent's segments (linked to the tool call that started it) are role "agent" when
    # true, "auxiliary" otherwise (`proxy.subagents`).
    train_subagents: bool = False
    # Calls the policy answers before the session refuses more (None: no limit): an episode's
    # `max_model_calls`. Calls running at once are counted when they end.
    max_calls: int | None = None
    trace: SessionTrace = field(default_factory=SessionTrace)
    created: float = field(default_factory=time.time)
    # How the policy writes reasoning (None: it does not), and the proxy's key for signing it
    # (empty: a key of the session's own).
    reasoning_format: ReasoningFormat | None = None
    reasoning_key: bytes = field(default=b"", repr=False)

    def __post_init__(self) -> None:
        self.signer = ReasoningSigner(self.reasoning_key or secrets.token_bytes(32),
                                      self.session_id)
        self.bridge = PromptBridge(self.renderer, self.trace, self.signer,
                                   train_subagents=self.train_subagents)
        self.parsed_messages = MessageParseCache()  # the history it resends, parsed once
        self.closed = False
        self.calls_in_flight = 0  # touched on the proxy's event loop only
        self.last_active = time.monotonic()

    def acquire_call_slot(self, limit: int) -> None:
        """Take one of the session's `limit` concurrent-call slots, or raise a 429."""
        if self.calls_in_flight >= limit:
            raise ProxyError(
                "rate_limited",
                f"Rate limit reached: this session already has {limit} calls in flight; "
                "retry when one finishes.",
            )
        self.calls_in_flight += 1
        self.last_active = time.monotonic()

    def release_call_slot(self) -> None:
        self.calls_in_flight -= 1
        self.last_active = time.monotonic()

    def idle_for(self, now: float) -> float:
        """Seconds since the last call started or ended; 0 while a call runs."""
        return 0.0 if self.calls_in_flight else now - self.last_active

    def check_open(self) -> None:
        """Raise when the session ended while one of its calls was running."""
        if self.closed:
            raise ProxyError("authentication", SESSION_CLOSED_DURING_CALL)

    def sampling_params(
        self, request: SamplingRequest, prompt_len: int, max_context: int, default_max_tokens: int
    ) -> SamplingParams:
        values: dict[str, Any] = {"max_tokens": default_max_tokens}
        for key in SAMPLING_KEYS:
            given = getattr(request, key)
            if given is not None:
                values[key] = given
        cap = self.sampling.get("max_tokens", default_max_tokens)
        values.update({k: v for k, v in self.sampling.items() if k != "max_tokens"})
        values["max_tokens"] = max(1, min(values["max_tokens"], cap, max_context - prompt_len))
        return SamplingParams(**values)

    def trace_json(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "segments": self.trace.to_dicts(),
            "n_llm_calls": self.trace.n_llm_calls,
            "n_tool_calls": self.trace.n_tool_calls,
            "n_truncations": self.trace.n_truncations,
            "n_altered_reasoning": self.trace.n_altered_reasoning,
        }


SESSION_CLOSED_DURING_CALL = (
    "This harness-gym session was closed while the call ran (the episode is over); the answer "
    "is not recorded."
)


class SessionRegistry:
    """The open sessions, the cap on their number and their idle expiry. Thread-safe: the env
    opens and closes sessions from its own threads while the proxy's loop looks them up."""

    _REMEMBERED_ENDS = 10_000  # ended keys whose 401 still says why

    def __init__(
        self, renderer: PromptRenderer, *, max_sessions: int = 1024,
        idle_timeout_s: float = 3600.0,
    ) -> None:
        self._renderer = renderer
        self._reasoning_format = ReasoningFormat.of(renderer.render_text,
                                                    renderer.tokenizer.chat_template)
        self._reasoning_key = secrets.token_bytes(32)  # signs reasoning; per proxy
        self._sessions: dict[str, ProxySession] = {}
        self._ended: OrderedDict[str, str] = OrderedDict()  # key -> why it no longer works
        self._lock = threading.Lock()
        self.max_sessions = max_sessions
        self.idle_timeout_s = idle_timeout_s

    def open(
        self,
        policy_version: int | None = None,
        sampling: dict[str, Any] | None = None,
        context_overflow: str = "error",
        train_subagents: bool = False,
        max_calls: int | None = None,
    ) -> ProxySession:
        session_id = "hg-" + secrets.token_urlsafe(24)
        session = ProxySession(
            session_id, self._renderer, parse_session_sampling(sampling), policy_version,
            context_overflow=check_context_overflow(context_overflow),
            train_subagents=train_subagents, max_calls=max_calls,
            reasoning_format=self._reasoning_format, reasoning_key=self._reasoning_key,
        )
        with self._lock:
            self._expire_idle(time.monotonic())
            if len(self._sessions) >= self.max_sessions:
                raise ProxyError(
                    "rate_limited",
                    f"Too many open sessions: {len(self._sessions)} of the proxy's max_sessions="
                    f"{self.max_sessions}. Close finished ones (DELETE /sessions/{{id}}) or "
                    "start the proxy with a larger max_sessions.",
                )
            self._sessions[session_id] = session
        return session

    def find(self, session_id: str) -> ProxySession | None:
        with self._lock:
            return self._sessions.get(session_id)

    def ids(self) -> list[str]:
        """The open sessions' ids, oldest first."""
        with self._lock:
            return list(self._sessions)

    def get(self, session_id: str) -> ProxySession:
        """The session a dialect call's key names; unknown, closed and expired keys are an
        authentication error that says which."""
        now = time.monotonic()
        with self._lock:
            session = self._sessions.get(session_id)
            if session is not None and session.idle_for(now) > self.idle_timeout_s:
                self._end(session, "expired")
                session = None
            if session is not None:
                return session
            ended = self._ended.get(session_id)
        if ended == "expired":
            message = (f"Session expired: it had no call for more than {self.idle_timeout_s:g} s "
                       "(the proxy's session_idle_timeout_s). Open a new session.")
        elif ended == "closed":
            message = "This harness-gym session was closed (the episode is over)."
        else:
            message = ("Incorrect API key provided: the key is not an open harness-gym session "
                       "(did the env close it?)")
        raise ProxyError("authentication", message)

    def close(self, session_id: str) -> ProxySession:
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                raise ProxyError("not_found", f"session {session_id!r} not found")
            self._end(session, "closed")
        return session

    def is_session_key(self, key: str) -> bool:
        """Whether `key` is, or was, a session key (to tell a 403 from a 401)."""
        with self._lock:
            return key in self._sessions or key in self._ended

    def _expire_idle(self, now: float) -> None:
        for session in [s for s in self._sessions.values()
                        if s.idle_for(now) > self.idle_timeout_s]:
            self._end(session, "expired")

    def _end(self, session: ProxySession, why: str) -> None:
        """Caller holds the lock."""
        del self._sessions[session.session_id]
        session.closed = True
        session.bridge.freeze()
        self._ended[session.session_id] = why
        while len(self._ended) > self._REMEMBERED_ENDS:
            self._ended.popitem(last=False)

    def __len__(self) -> int:
        return len(self._sessions)
