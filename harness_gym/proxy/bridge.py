"""The append-only prompt bridge: reuse the exact ids of earlier turns.

Every call's messages are hashed as a chain (`h_i = H(h_{i-1} || key(m_i))`, seeded with the
tool list), where `key` is the semantic key of `canonical.Message`. After a call, the bridge
remembers the chain value of "its messages + the turn we sampled". A later request that contains
that chain value at an assistant position extends the call: its prompt is the call's prompt and
completion ids, verbatim, plus the ids of only the messages after that turn. A request whose
chain matches no turn we sampled is rendered in full and starts a new segment (compaction,
truncation, a system-prompt swap, a side conversation). A request identical to an earlier one is
a retry: it reuses that call's prompt, and the earlier answer moves to a `discarded` segment.
Reasoning is not part of a message's key: a turn echoed without it is still ours; a turn whose
echoed reasoning was altered changes the chain from there on (`_chain`), so no prompt extends
through it.

`plan` decides and builds the prompt without touching the trace; `commit` records the answer.
The split lets generation run between them with no lock held, and lets an aborted or rejected
call leave the trace untouched.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

from ..engines.base import Completion
from ..trace import CallRecord, CallSampling, SegmentRole, SessionTrace, TraceSegment
from .canonical import AssistantTurn, ChatRequest, Message
from .reasoning import NO_ECHOES, EchoReport, ReasoningSigner, echo_digest, echo_status
from .rendering import PromptRenderer, PromptTooLong, TemplateNotIncremental
from .subagents import SpawnRegistry, SubagentLink, opening_text
from .tool_choice import NO_STEERING, Steering


TRUNCATED_TOOL_RESULT = "[tool output removed by harness-gym: the context was full]"


class TraceFrozen(Exception):
    """The session ended: its trace takes no more calls."""


class ContextStillTooLong(Exception):
    def __init__(self, prompt_tokens: int) -> None:
        super().__init__(f"still {prompt_tokens} tokens with every tool result removed")
        self.prompt_tokens = prompt_tokens


def _chain(previous: bytes, key: bytes) -> bytes:
    return hashlib.blake2b(previous + key, digest_size=16).digest()


@dataclass(frozen=True)
class TurnNode:
    """Where one committed call's tokens live: `segment` holds its prompt in
    `tokens[:prompt_end]` and its completion in `tokens[prompt_end:end]`."""

    segment: int
    prompt_end: int
    end: int
    n_calls: int  # the segment's call count once this call was appended
    request_key: bytes
    call_index: int
    assistant: Message
    turn_closed: bool  # the completion ended with a stop token


@dataclass
class PromptPlan:
    prompt_ids: list[int]
    request_key: bytes
    tools_key: bytes
    kind: Literal["extend", "new", "retry"]
    parent: TurnNode | None = None  # set for "extend" and "retry"
    inserted_ids: tuple[int, ...] = ()  # tokens after parent.end; mask 0
    truncated_tool_results: int = 0
    sampling: CallSampling | None = None  # set once the call's sampling is settled; recorded
    # The answer's first tokens, written by the proxy to obey `tool_choice` (`tool_choice`
    # module): the engine sees them after the prompt; the trace records them with mask 0.
    steering: Steering = NO_STEERING
    forced_ids: tuple[int, ...] = ()
    opening: str = ""  # the first user message: a sub-agent's brief (`subagents`)
    echoes: EchoReport = NO_ECHOES  # how the request echoed our turns' reasoning


class PromptBridge:
    def __init__(
        self, renderer: PromptRenderer, trace: SessionTrace,
        signer: ReasoningSigner | None = None, *, train_subagents: bool = False,
    ) -> None:
        """`train_subagents`: a sub-agent's segments get role `agent` (trained on) instead of
        `auxiliary`; they are linked to the tool call that started them either way."""
        self.renderer = renderer
        self.trace = trace
        self.signer = signer or ReasoningSigner(secrets.token_bytes(32), "bridge")
        self.train_subagents = train_subagents
        self._spawns = SpawnRegistry()
        self._subagent_tools: set[bytes] = set()  # tool sets sub-agents were seen with
        self._lock = threading.Lock()
        self._turns: dict[bytes, TurnNode] = {}  # chain after our turn -> node
        self._requests: dict[bytes, TurnNode] = {}  # chain of a request -> its node
        self._agent_tools_key: bytes | None = None
        self._frozen = False

    def freeze(self) -> None:
        """No call is recorded from now on (the session ended; its owner has the trace)."""
        with self._lock:
            self._frozen = True

    def plan(self, request: ChatRequest, budget: int | None = None) -> PromptPlan:
        """The prompt for `request`. With a `budget`, a prompt that clearly has more tokens
        raises `PromptTooLong` after about that much tokenizing, whatever the request's size."""
        keys = [message.semantic_key() for message in request.messages]
        with self._lock:
            chain, echoes = self._chain(request, keys)
            plan = self._plan_reusing(request, chain, budget)
        if plan is None:
            plan = PromptPlan(self.renderer.render_full(request.messages, request.tools, budget),
                              chain[-1], chain[0], "new")
        plan.echoes = echoes
        plan.opening = opening_text(request.messages)
        return plan

    def _plan_reusing(
        self, request: ChatRequest, chain: list[bytes], budget: int | None
    ) -> PromptPlan | None:
        """A plan that reuses earlier ids (a retry, or an extension of one of our turns), or
        None (caller holds the lock)."""
        request_key, tools_key = chain[-1], chain[0]
        retried = self._requests.get(request_key)
        if retried is not None:
            segment = self.trace.segments[retried.segment]
            return PromptPlan(
                segment.tokens[: retried.prompt_end], request_key, tools_key, "retry", retried
            )
        for position in range(len(request.messages) - 1, -1, -1):
            if request.messages[position].role != "assistant":
                continue
            parent = self._turns.get(chain[position + 1])
            if parent is None:
                continue
            try:
                inserted = self.renderer.render_after(
                    parent.assistant, request.messages[position + 1 :], parent.turn_closed,
                    None if budget is None else max(0, budget - parent.end),
                )
            except TemplateNotIncremental:
                break
            except PromptTooLong as exc:
                raise PromptTooLong(parent.end + exc.prompt_tokens) from None
            segment = self.trace.segments[parent.segment]
            prompt = segment.tokens[: parent.end]
            prompt.extend(inserted)
            return PromptPlan(prompt, request_key, tools_key, "extend", parent, tuple(inserted))
        return None

    def _chain(
        self, request: ChatRequest, keys: list[bytes] | None = None
    ) -> tuple[list[bytes], EchoReport]:
        """The chain values (seeded with the tool list's key, one more per message) and how
        our turns' reasoning came back (caller holds the lock). A turn of ours whose echoed
        reasoning was altered mixes that echo into the chain from there on: no turn sampled
        after the original one matches, while a turn sampled for this very history (the fork
        it causes) is found again when the CLI repeats it."""
        if keys is None:
            keys = [message.semantic_key() for message in request.messages]
        chain = [request.tools_key()]
        missing = altered = 0
        for message, key in zip(request.messages, keys):
            value = _chain(chain[-1], key)
            node = self._turns.get(value) if message.role == "assistant" else None
            if node is not None:
                status = echo_status(message, node.assistant, self.signer)
                missing += status == "missing"
                if status == "altered":
                    altered += 1
                    value = _chain(value, b"altered reasoning" + echo_digest(message))
            chain.append(value)
        return chain, EchoReport(missing, altered)

    def plan_truncated(
        self, request: ChatRequest, fits: Callable[[int], bool], budget: int | None = None
    ) -> PromptPlan:
        """A prompt for a request too long for the model: the oldest tool results are blanked
        until `fits(prompt_len)`, as few as possible (found by bisection: each try renders the
        whole conversation, so trying them one by one would be quadratic). The prompt no longer
        extends earlier tokens, so it starts a new segment; its turn is remembered under the
        *original* request's chain, so the CLI's next call (full history + our turn) extends the
        truncated segment. Raises `ContextStillTooLong` when blanking every tool result is not
        enough."""
        with self._lock:
            chain, _ = self._chain(request)
        tool_results = [i for i, m in enumerate(request.messages)
                        if m.role == "tool" and m.content != TRUNCATED_TOOL_RESULT]
        tried: dict[int, list[int] | PromptTooLong] = {}

        def render(blanked: int) -> list[int] | PromptTooLong:
            if blanked not in tried:
                messages = list(request.messages)
                for index in tool_results[:blanked]:
                    messages[index] = replace(messages[index], content=TRUNCATED_TOOL_RESULT,
                                              parts=())  # its images go too
                try:
                    tried[blanked] = self.renderer.render_full(messages, request.tools, budget)
                except PromptTooLong as exc:
                    tried[blanked] = exc
            return tried[blanked]

        def fitting(blanked: int) -> bool:
            prompt = render(blanked)
            return not isinstance(prompt, PromptTooLong) and fits(len(prompt))

        low, high = 1, len(tool_results)
        if not tool_results or not fitting(high):
            last = render(high)
            raise ContextStillTooLong(
                last.prompt_tokens if isinstance(last, PromptTooLong) else len(last))
        while low < high:
            middle = (low + high) // 2
            if fitting(middle):
                high = middle
            else:
                low = middle + 1
        prompt = render(high)
        assert not isinstance(prompt, PromptTooLong)
        return PromptPlan(prompt, chain[-1], chain[0], "new", truncated_tool_results=high,
                          opening=opening_text(request.messages))

    def commit(
        self, plan: PromptPlan, completion: Completion, turn: AssistantTurn, latency_s: float
    ) -> TurnNode:
        """Record a finished call and remember its turn for later calls to extend."""
        with self._lock:
            if self._frozen:
                raise TraceFrozen("the session ended before this call finished")
            kind, segment_index = self._place(plan)
            segment = self.trace.segments[segment_index]
            inserted = plan.inserted_ids if kind == "extend" else ()
            prompt_end = len(segment.tokens) + len(inserted)
            segment.append_call(
                inserted + plan.forced_ids,
                completion.token_ids,
                completion.logprobs,
                completion.policy_version,
                plan.sampling,
                forced=len(plan.forced_ids),
            )
            node = TurnNode(
                segment=segment_index,
                prompt_end=prompt_end,
                end=len(segment.tokens),
                n_calls=segment.n_calls,
                request_key=plan.request_key,
                call_index=len(self.trace.calls),
                assistant=turn.as_message(),
                turn_closed=bool(completion.token_ids)
                and completion.token_ids[-1] in self.renderer.stop_token_ids,
            )
            self.trace.calls.append(
                CallRecord(
                    segment=segment_index,
                    prompt_tokens=len(plan.prompt_ids),
                    completion_tokens=len(completion.token_ids),
                    finish_reason=turn.finish_reason,
                    n_tool_calls=len(turn.tool_calls),
                    policy_version=completion.policy_version,
                    bridged=plan.kind != "new",
                    kind=kind,
                    latency_s=latency_s,
                    truncated_tool_results=plan.truncated_tool_results,
                    missing_reasoning=plan.echoes.missing,
                    altered_reasoning=plan.echoes.altered,
                )
            )
            self._spawns.add(node.call_index, turn.tool_calls)
            self._requests[plan.request_key] = node
            self._turns[_chain(plan.request_key, node.assistant.semantic_key())] = node
            return node

    def record_aborted(self, plan: PromptPlan, completion: Completion, latency_s: float) -> None:
        """Keep what was sampled before an abort, in its own segment marked incomplete, so it is
        neither lost nor stitched into a segment a trainer would learn from."""
        with self._lock:
            if self._frozen:
                return
            segment = TraceSegment(
                "discarded", list(plan.prompt_ids), len(plan.prompt_ids), incomplete=True
            )
            segment.append_call(plan.forced_ids, completion.token_ids, completion.logprobs,
                                completion.policy_version, plan.sampling,
                                forced=len(plan.forced_ids))
            self.trace.segments.append(segment)
            self.trace.calls.append(
                CallRecord(
                    segment=len(self.trace.segments) - 1,
                    prompt_tokens=len(plan.prompt_ids),
                    completion_tokens=len(completion.token_ids),
                    finish_reason="abort",
                    n_tool_calls=0,
                    policy_version=completion.policy_version,
                    bridged=plan.kind != "new",
                    kind="aborted",
                    latency_s=latency_s,
                )
            )

    def _place(self, plan: PromptPlan) -> tuple[str, int]:
        """Choose the segment a finished call goes into (caller holds the lock)."""
        segments = self.trace.segments
        retried = self._requests.get(plan.request_key)
        if retried is not None and self._is_tail(retried):
            self._discard_answer(retried)
            return "retry", retried.segment
        if plan.kind == "extend" and plan.parent is not None and self._is_tail(plan.parent):
            return "extend", plan.parent.segment
        # A new segment. Its prompt either copies an earlier call's tokens (the parent's segment
        # has moved on: a rewrite of later history, a parallel side call) or was rendered in full.
        # The agent is whoever uses the first call's tool set; other tool sets (title
        # generation, sub-agents) are auxiliary.
        if self._agent_tools_key is None:
            self._agent_tools_key = plan.tools_key
        parent = plan.parent.segment if plan.parent is not None else None
        role, link = self._role(plan, parent)
        # A copy: the segment grows as calls land, the plan's prompt must not.
        segment = TraceSegment(role, list(plan.prompt_ids), len(plan.prompt_ids), parent=parent)
        if link is not None:
            segment.parent = self.trace.calls[link.call_index].segment
            segment.parent_call_id = link.call_id
        segments.append(segment)
        return ("branch" if parent is not None else "new"), len(segments) - 1

    def _role(self, plan: PromptPlan, parent: int | None) -> tuple[SegmentRole, SubagentLink | None]:
        """A new segment's role, and the tool call it is the sub-agent of (caller holds the
        lock). A branch keeps its `parent` (the segment it copies) and is not linked again."""
        if plan.tools_key == self._agent_tools_key:
            return "agent", None
        link = self._spawns.find(plan.opening) if parent is None else None
        if link is not None and self.trace.segments[
                self.trace.calls[link.call_index].segment].role == "discarded":
            link = None  # the call was retried: its answer never reached the harness
        if link is not None:
            self._subagent_tools.add(plan.tools_key)
        if link is not None or plan.tools_key in self._subagent_tools:
            return ("agent" if self.train_subagents else "auxiliary"), link
        return "auxiliary", None

    def _is_tail(self, node: TurnNode) -> bool:
        segment = self.trace.segments[node.segment]
        return (
            segment.role != "discarded"
            and len(segment.tokens) == node.end
            and segment.n_calls == node.n_calls
        )

    def _discard_answer(self, node: TurnNode) -> None:
        """Move a retried call's abandoned answer into a `discarded` segment."""
        segment = self.trace.segments[node.segment]
        abandoned = TraceSegment(
            "discarded",
            segment.tokens[: node.end],
            node.prompt_end,
            loss_mask=segment.loss_mask[node.prompt_end - segment.prompt_len :],
            response_logprobs=segment.response_logprobs[node.prompt_end - segment.prompt_len :],
            policy_versions=segment.policy_versions[node.n_calls - 1 : node.n_calls],
            sampling=segment.sampling[node.n_calls - 1 : node.n_calls],
            forced_tokens=segment.forced_tokens[node.n_calls - 1 : node.n_calls],
            call_starts=[0],
            parent=node.segment,
        )
        segment.truncate(node.prompt_end, node.n_calls - 1)
        self.trace.segments.append(abandoned)
        self.trace.calls[node.call_index].segment = len(self.trace.segments) - 1
        self._turns.pop(_chain(node.request_key, node.assistant.semantic_key()), None)
