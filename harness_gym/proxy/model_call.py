"""One model call, dialect-neutral: plan the prompt, stream from the engine, parse, record.

`plan_prompt` (in a worker thread) and `start_call` do everything that can reject a request
(prompt building, the context check, and an engine that fails at once), so a dialect can still
answer with an HTTP error; afterwards `PreparedCall.events()` streams `TextDelta` /
`ToolCallDone` as tokens are sampled and ends with `CallFinished` (see `events`). While a long prefill keeps the first token away, `events()`
yields `KeepAlive` every `keepalive_s`, so a streaming dialect can send pings and CLIs with idle
timers wait. Whatever happens to the stream (finished, client gone, engine failure) the trace
gets exactly one consistent entry: a committed call, or an aborted one marked incomplete.
The text and tool-call work per chunk lives in `answer`; this module wires it to the engine.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

import anyio

from ..engines.base import (
    Completion,
    ContextLengthExceeded,
    Engine,
    EngineError,
    ReportsVersion,
    RequestContext,
    TokenChunk,
)
from ..trace import CallSampling
from .answer import AnswerText, ParsedAnswer
from .bridge import ContextStillTooLong, PromptPlan, TraceFrozen
from .canonical import ChatRequest
from .errors import ProxyError, invalid
from .events import CallEvent, CallFinished, CallProgress, KeepAlive
from .reasoning import THINK_CLOSE, ThinkSplitter
from .rendering import PromptTooLong
from .sessions import SESSION_CLOSED_DURING_CALL, ProxySession
from .settings import ProxySettings
from .tool_choice import steer
from .tool_parsers import make_tool_call_parser, tool_call_open_tag


class PreparedCall:
    def __init__(
        self,
        session: ProxySession,
        engine: Engine,
        request: ChatRequest,
        plan: PromptPlan,
        stream: AsyncIterator[TokenChunk],
        first: asyncio.Future[TokenChunk | None],
        started: float,
        keepalive_s: float,
        context: RequestContext,
        on_progress: Callable[[CallProgress], None] | None = None,
    ) -> None:
        self.session = session
        self.engine = engine
        self.request = request
        self.plan = plan
        self._stream = stream
        self._first = first
        self._consumed = False
        self._started = started
        self._keepalive_s = keepalive_s
        self._on_progress = on_progress
        self.completion = Completion(policy_version=engine.version_for(context))

    @property
    def prompt_tokens(self) -> int:
        return len(self.plan.prompt_ids)

    async def events(self) -> AsyncIterator[CallEvent]:
        self._consumed = True
        steering = self.plan.steering
        text = AnswerText(self.engine.tokenizer,
                          (*self.request.sampling.stop, *steering.hidden_stops))
        thinking = self.session.reasoning_format
        answer = ParsedAnswer(  # reasoning is split off before tool calls are parsed
            make_tool_call_parser(self.engine.tool_call_format),
            steering.max_tool_calls,
            None if thinking is None else ThinkSplitter(thinking, self.session.signer.sign),
        )
        try:
            for event in answer.feed(steering.forced_text):  # the forced start of the answer
                yield event
            self._report(finished=False)  # before the prefill ends: the call has started
            async for ping in keepalives_until(self._first, self._keepalive_s):
                yield ping
            chunk = _first_result(self._first, self.session)
            while chunk is not None:
                self.session.check_open()  # an ended session stops its calls at the next chunk
                self.completion.add(chunk)
                self._report(finished=False)
                for event in answer.feed(text.push(chunk)):
                    yield event
                if (text.stop_hit is not None or chunk.finish_reason is not None
                        or answer.full):
                    break
                try:
                    chunk = await anext(self._stream, None)
                except EngineError as exc:  # the engine died mid-stream (no failover there)
                    self.session.trace.note_engine_failure(str(exc))
                    raise
            self._take_server_version()
            for event in answer.finish():
                yield event
        except BaseException:
            self._abort()
            raise
        finally:
            await self._close_stream()
        yield self._commit(answer, text.stop_hit)

    def _commit(self, answer: ParsedAnswer, stop_hit: str | None) -> CallFinished:
        """Record the finished answer; a stop string that ended it makes it a "stop" (the
        client hears of it only if it asked for that string, not for a `tool_choice` stop)."""
        if stop_hit is not None:
            self.completion.finish_reason = "stop"
            if stop_hit not in self.request.sampling.stop:
                stop_hit = None
        turn = answer.turn(self.completion.finish_reason)
        try:
            self.session.bridge.commit(self.plan, self.completion, turn, self._elapsed())
        except TraceFrozen:
            raise ProxyError("authentication", SESSION_CLOSED_DURING_CALL) from None
        self._report(finished=True)
        return CallFinished(turn, self.prompt_tokens, len(self.completion.token_ids), stop_hit)

    def _abort(self) -> None:
        """Keep what was sampled before the call ended early, marked incomplete (unless the
        session ended: its trace is final)."""
        self.completion.finish_reason = "abort"
        self.session.bridge.record_aborted(self.plan, self.completion, self._elapsed())
        self._report(finished=True)

    async def run(self) -> CallFinished:
        """Consume the whole call (non-streaming answers)."""
        async for event in self.events():
            if isinstance(event, CallFinished):
                return event
        raise AssertionError("a call stream always ends with CallFinished")

    async def discard_if_unconsumed(self) -> None:
        """Release the engine request of a call whose events were never read (the client went
        away before its answer started): nothing was sampled for it, nothing is recorded."""
        if self._consumed:
            return
        self._consumed = True
        await self._close_stream()

    async def _close_stream(self) -> None:
        """Tell the engine the request is over. The first chunk is read by a task of its own:
        that task must have left the stream before it is closed (closing a generator another
        task is inside raises). Shielded: when the client went away this runs inside a
        cancelled scope, and the engine must still hear of it."""
        self._first.cancel()
        with anyio.CancelScope(shield=True):
            await asyncio.wait({self._first})
            if not self._first.cancelled():
                self._first.exception()  # marked read: the call has ended without it
            await self._stream.aclose()

    def _take_server_version(self) -> None:
        # A remote engine may report which weights sampled this answer (vLLM: on its last
        # chunk); that beats the trainer's label.
        if isinstance(self._stream, ReportsVersion) and self._stream.policy_version is not None:
            self.completion.policy_version = self._stream.policy_version

    def _elapsed(self) -> float:
        return time.perf_counter() - self._started

    def _report(self, *, finished: bool) -> None:
        if self._on_progress is not None:
            self._on_progress(CallProgress(
                self.session.session_id, self.prompt_tokens, len(self.completion.token_ids),
                finished,
            ))


def plan_prompt(
    session: ProxySession, engine: Engine, request: ChatRequest, settings: ProxySettings
) -> PromptPlan:
    """The prompt ids for `request` (bridged where it extends an earlier call), checked
    against the engine's context; an overflow is the context error, or a truncated prompt
    where the session asked for that. Synchronous and CPU-bound: run it in a worker thread.

    Tokenizing stops early a quarter past the context: a longer prompt is refused either way
    (its error then says "at least N tokens"), and what it costs must not grow with what a
    client sends."""
    if session.max_calls is not None and session.trace.n_llm_calls >= session.max_calls:
        session.trace.call_limit_refusals += 1  # the episode stops its CLI on seeing it
        raise invalid(f"This session's call limit is reached: the model answered "
                      f"{session.trace.n_llm_calls} calls of at most {session.max_calls} "
                      "(max_model_calls); the episode ends here.")
    try:
        plan = _plan_prompt(session, engine, request, settings)
        return _steer(plan, session, engine, request)
    except ProxyError as error:
        if error.kind == "context_length":  # the episode tells "cannot start" from the trace
            session.trace.note_overflow(error.prompt_tokens, error.max_context)
        raise


def _plan_prompt(
    session: ProxySession, engine: Engine, request: ChatRequest, settings: ProxySettings
) -> PromptPlan:
    budget = prompt_budget(engine)
    try:
        plan = session.bridge.plan(request, budget)
        engine.check_fits(len(plan.prompt_ids))
        return plan
    except (ContextLengthExceeded, PromptTooLong) as exc:
        overflow = (exc if isinstance(exc, ContextLengthExceeded)
                    else ContextLengthExceeded(exc.prompt_tokens, engine.max_context))
    if session.context_overflow != "truncate":
        raise _context_error(overflow)
    # Room for an answer (the session's token cap, within a quarter of the context), and cut
    # down to three quarters of what is left, so the next turns extend this segment instead of
    # each truncating (and forking) again.
    reserve = min(session.sampling.get("max_tokens", settings.default_max_tokens),
                  engine.max_context // 4)
    low_water = (engine.max_context - reserve) * 3 // 4
    try:
        return session.bridge.plan_truncated(request, lambda n: n <= low_water, budget)
    except ContextStillTooLong as exc:
        raise _context_error(ContextLengthExceeded(exc.prompt_tokens, engine.max_context)) from None


def _steer(
    plan: PromptPlan, session: ProxySession, engine: Engine, request: ChatRequest
) -> PromptPlan:
    """Settle how the answer obeys the request's `tool_choice`: its forced first tokens."""
    plan.steering = steer(request.tool_choice, tool_call_open_tag(engine.tool_call_format))
    thinking = session.reasoning_format
    if plan.steering.forced_text and thinking is not None and thinking.opened:
        # The generation prompt opened `<think>`: a forced call comes after closing it, so
        # the call is parsed as the answer, not as reasoning.
        plan.steering = replace(plan.steering,
                                forced_text=THINK_CLOSE + "\n\n" + plan.steering.forced_text)
    if plan.steering.forced_text:
        plan.forced_ids = tuple(session.bridge.renderer.encode(plan.steering.forced_text))
        try:
            engine.check_fits(len(plan.prompt_ids) + len(plan.forced_ids))
        except ContextLengthExceeded as exc:
            raise _context_error(exc) from None
    return plan


def prompt_budget(engine: Engine) -> int:
    """How many prompt tokens are worth counting exactly for this engine."""
    return engine.max_context + engine.max_context // 4


async def start_call(
    session: ProxySession,
    engine: Engine,
    request: ChatRequest,
    plan: PromptPlan,
    settings: ProxySettings,
    started: float,
) -> PreparedCall:
    """Send the planned prompt to the engine and wait up to `first_token_grace_s` for its first
    chunk, so an engine that fails at once still gets an HTTP error."""
    engine_prompt = [*plan.prompt_ids, *plan.forced_ids]
    sampling = session.sampling_params(
        request.sampling, len(engine_prompt), engine.max_context, settings.default_max_tokens
    )
    plan.sampling = CallSampling.of(sampling)  # the trace records what drew the tokens
    context = RequestContext(routing_key=session.session_id, policy_version=session.policy_version)
    try:
        stream = engine.stream(engine_prompt, sampling, context)
    except ContextLengthExceeded as exc:
        raise _context_error(exc) from None
    first = asyncio.ensure_future(anext(stream, None))
    await asyncio.wait({first}, timeout=settings.first_token_grace_s)
    if first.done():
        try:
            _first_result(first, session)
        except ProxyError:
            with anyio.CancelScope(shield=True):
                await stream.aclose()
            raise
    return PreparedCall(
        session, engine, request, plan, stream, first, started, settings.keepalive_s, context,
        settings.on_progress,
    )


async def keepalives_until(
    first: asyncio.Future[TokenChunk | None], interval_s: float
) -> AsyncIterator[KeepAlive]:
    """A `KeepAlive` every `interval_s` until the engine's first chunk is there."""
    while not first.done():
        await asyncio.wait({first}, timeout=interval_s)
        if not first.done():
            yield KeepAlive()


def _first_result(first: asyncio.Future[TokenChunk | None], session: ProxySession
                  ) -> TokenChunk | None:
    """The engine's first chunk, its failure mapped to the error a client can act on (and
    noted in the session's trace)."""
    try:
        chunk = first.result()
    except ContextLengthExceeded as exc:
        raise _context_error(exc) from None
    except EngineError as exc:
        session.trace.note_engine_failure(str(exc))
        raise ProxyError("overloaded", f"the engine is unavailable, retry later: {exc}") from None
    return TokenChunk([], [], "stop") if chunk is None else chunk


def _context_error(exc: ContextLengthExceeded) -> ProxyError:
    return ProxyError(
        "context_length",
        str(exc),
        param="messages",
        prompt_tokens=exc.prompt_tokens,
        max_context=exc.max_context,
    )
