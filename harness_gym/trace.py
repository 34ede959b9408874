"""The token-faithful trace of one session: segments of exact token ids and p_old.

A segment is one unbroken token sequence: the first call's prompt, then for each later call the
tokens the proxy inserted (tool results, user turns: `loss_mask` 0, logprob 0.0) and the tokens
the engine sampled (`loss_mask` 1, the engine's logprob). Storage is linear in the episode's
length: each call adds only its new tokens.

Exported segments (`TraceSegment.to_dict`) hold plain Python lists, so they serialise to JSON
and Parquet unchanged; wrap them in `numpy.asarray` where arrays are wanted. `SEGMENT_SCHEMA`
is the one definition of an exported segment's fields and types: every writer (the env's `info`,
the proxy's trace route, `RecordTraces`' JSONL and Parquet) and reader (`harness-gym trace`, the
TRL integration) goes by it.

Each call also leaves how it was sampled (`CallSampling`: temperature, top-p, top-k, max_tokens,
seed), one entry per call in the `sampling_*` fields, and where its tokens start in the response
(`call_starts`), so a trainer can re-score each call's tokens under the distribution that drew
them: the recorded logprobs are of the temperature-scaled, top-k/top-p-filtered distribution.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

SegmentRole = Literal["agent", "auxiliary", "discarded"]
# The value types an exported segment's fields take ("int?": an int or None; "list[int8]": a
# list of 0/1 flags, stored narrow).
SegmentFieldType = Literal[
    "str", "str?", "bool", "int", "int?", "list[int]", "list[int8]", "list[float]", "list[int?]",
    "list[float?]",
]

#: An exported segment's fields, in order, with their types.
SEGMENT_SCHEMA: Mapping[str, SegmentFieldType] = {
    "role": "str",  # agent | auxiliary | discarded
    "prompt_ids": "list[int]",
    "response_ids": "list[int]",  # sampled and inserted tokens after the prompt
    "loss_mask": "list[int8]",  # 1: sampled by the engine, 0: inserted by the proxy
    "response_logprobs": "list[float]",  # p_old per response token, 0.0 where the mask is 0
    "policy_version": "int",  # the oldest version that sampled into the segment
    "policy_versions": "list[int]",  # one per call, in order
    "n_calls": "int",
    "incomplete": "bool",  # the last call's generation was aborted
    # The segment this one hangs under: the one whose tokens its prompt copies (a branch), or,
    # for a sub-agent (`parent_call_id` set), the one holding the tool call that started it.
    "parent": "int?",
    "parent_call_id": "str?",  # the tool call a sub-agent's conversation answers (see proxy.subagents)
    # One entry per call, in order; None where it was not recorded (older files, a bridge
    # driven without a sampler).
    "call_starts": "list[int?]",  # offset in response_ids where the call's tokens begin
    "sampling_temperature": "list[float?]",
    "sampling_top_p": "list[float?]",
    "sampling_top_k": "list[int?]",  # 0: no top-k
    "sampling_max_tokens": "list[int?]",  # the cap the engine sampled under
    "sampling_seed": "list[int?]",  # None also when no seed was set
    # Of the mask-0 tokens just before the call's sampled ones, how many the proxy forced into
    # the answer to obey `tool_choice` (a tool-call prefix); 0: none.
    "forced_tokens": "list[int?]",
}
_PER_CALL = ("call_starts", "sampling_temperature", "sampling_top_p", "sampling_top_k",
             "sampling_max_tokens", "sampling_seed", "forced_tokens")

_EMPTY: dict[SegmentFieldType, Any] = {
    "str": "", "str?": None, "bool": False, "int": 0, "int?": None,
    "list[int]": [], "list[int8]": [], "list[float]": [], "list[int?]": [], "list[float?]": [],
}


def normalize_segment(raw: Mapping[str, Any]) -> dict[str, Any]:
    """An exported segment read back (from JSON, Parquet, an older file) with exactly the
    schema's fields: missing ones get their empty value, unknown ones are dropped."""
    out = {name: copy.copy(raw.get(name, _EMPTY[kind])) for name, kind in SEGMENT_SCHEMA.items()}
    if "policy_versions" not in raw and "policy_version" in raw:  # files before the list
        out["policy_versions"] = [raw["policy_version"]]
    if "n_calls" not in raw:
        out["n_calls"] = len(out["policy_versions"])
    for name in _PER_CALL:
        if name not in raw:  # files written before it was recorded
            out[name] = [None] * out["n_calls"]
    return out


@dataclass(frozen=True)
class CallSampling:
    """How one call was sampled: the parameters the engine got (after the session's overrides
    and the context cap), so its logprobs can be reproduced."""

    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    seed: int | None = None

    @classmethod
    def of(cls, params: Any) -> CallSampling:
        """From an engine's `SamplingParams` (or anything with those attributes)."""
        return cls(float(params.temperature), float(params.top_p), int(params.top_k),
                   int(params.max_tokens), params.seed)


@dataclass
class TraceSegment:
    role: SegmentRole
    tokens: list[int]  # prompt followed by response
    prompt_len: int
    loss_mask: list[int] = field(default_factory=list)
    response_logprobs: list[float] = field(default_factory=list)
    policy_versions: list[int] = field(default_factory=list)  # one per call, in order
    sampling: list[CallSampling | None] = field(default_factory=list)  # one per call
    call_starts: list[int] = field(default_factory=list)  # one per call: response offset
    forced_tokens: list[int] = field(default_factory=list)  # one per call (tool_choice)
    incomplete: bool = False  # generation was aborted (client gone, engine failed)
    parent: int | None = None  # see SEGMENT_SCHEMA
    parent_call_id: str | None = None  # set on a sub-agent's segment

    @property
    def prompt_ids(self) -> list[int]:
        return self.tokens[: self.prompt_len]

    @property
    def response_ids(self) -> list[int]:
        return self.tokens[self.prompt_len :]

    @property
    def n_calls(self) -> int:
        return len(self.policy_versions)

    def append_call(
        self,
        inserted_ids: Sequence[int],
        sampled_ids: Sequence[int],
        sampled_logprobs: Sequence[float],
        policy_version: int,
        sampling: CallSampling | None = None,
        forced: int = 0,
    ) -> None:
        """`inserted_ids` end with the `forced` tokens the proxy wrote into the answer."""
        if len(sampled_ids) != len(sampled_logprobs):
            raise ValueError("every sampled token needs exactly one logprob")
        self.call_starts.append(len(self.tokens) - self.prompt_len)
        self.forced_tokens.append(forced)
        self.sampling.append(sampling)
        self.tokens.extend(inserted_ids)
        self.loss_mask.extend([0] * len(inserted_ids))
        self.response_logprobs.extend([0.0] * len(inserted_ids))
        self.tokens.extend(sampled_ids)
        self.loss_mask.extend([1] * len(sampled_ids))
        self.response_logprobs.extend(sampled_logprobs)
        self.policy_versions.append(policy_version)

    def truncate(self, length: int, n_calls: int) -> None:
        """Cut back to the first `length` tokens and `n_calls` calls (a retried call's
        abandoned answer is moved elsewhere first)."""
        if length < self.prompt_len:
            raise ValueError("cannot truncate into the segment's first prompt")
        keep = length - self.prompt_len
        del self.tokens[length:]
        del self.loss_mask[keep:]
        del self.response_logprobs[keep:]
        del self.policy_versions[n_calls:]
        del self.sampling[n_calls:]
        del self.call_starts[n_calls:]
        del self.forced_tokens[n_calls:]

    def to_dict(self) -> dict[str, Any]:
        """The exported segment: `SEGMENT_SCHEMA`'s fields, plain lists."""
        return {
            "role": self.role,
            "prompt_ids": self.prompt_ids,
            "response_ids": self.response_ids,
            "loss_mask": list(self.loss_mask),
            "response_logprobs": list(self.response_logprobs),
            "policy_version": min(self.policy_versions, default=0),
            "policy_versions": list(self.policy_versions),
            "n_calls": self.n_calls,
            "incomplete": self.incomplete,
            "parent": self.parent,
            "parent_call_id": self.parent_call_id,
            "call_starts": self._per_call(self.call_starts),
            **{f"sampling_{name}": [getattr(s, name) if s is not None else None
                                    for s in self._per_call(self.sampling)]
               for name in ("temperature", "top_p", "top_k", "max_tokens", "seed")},
            "forced_tokens": self._per_call(self.forced_tokens),
        }

    def _per_call(self, values: list[Any]) -> list[Any]:
        # Segments built by hand (tests, a placeholder row) may hold fewer records than calls.
        return list(values[: self.n_calls]) + [None] * (self.n_calls - len(values))


@dataclass
class CallRecord:
    """Bookkeeping for one model call (small: no token ids)."""

    segment: int
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    n_tool_calls: int
    policy_version: int
    bridged: bool  # the prompt extended an earlier call's tokens
    kind: str  # "extend", "new", "branch", "retry", "aborted"
    latency_s: float
    truncated_tool_results: int = 0  # blanked by context_overflow="truncate"
    # Turns of ours whose reasoning the request did not echo (ids reused anyway), and whose
    # echoed reasoning was altered or carried a signature we did not issue (no prompt extends
    # through those): see `proxy.reasoning`.
    missing_reasoning: int = 0
    altered_reasoning: int = 0


@dataclass(frozen=True)
class ContextOverflow:
    """A call the proxy refused because its prompt did not fit the model's context."""

    prompt_tokens: int | None
    max_context: int | None
    after_calls: int  # calls answered before it: 0 means the CLI's very first prompt did not fit


@dataclass
class SessionTrace:
    segments: list[TraceSegment] = field(default_factory=list)
    calls: list[CallRecord] = field(default_factory=list)
    overflows: list[ContextOverflow] = field(default_factory=list)
    # Why the engine failed a call (down, or died mid-stream): the episode's outcome is then
    # ours (`infra_error`), not the policy's. A server failed over before its first token
    # never reaches here.
    engine_failures: list[str] = field(default_factory=list)
    # Calls refused because the session's `max_calls` were answered already.
    call_limit_refusals: int = 0

    def note_engine_failure(self, message: str) -> None:
        self.engine_failures.append(message)

    def note_overflow(self, prompt_tokens: int | None, max_context: int | None) -> None:
        self.overflows.append(ContextOverflow(prompt_tokens, max_context, self.n_llm_calls))

    @property
    def first_prompt_overflowed(self) -> ContextOverflow | None:
        """The refusal of a prompt sent before the model answered any call: the harness cannot
        work in this model's context at all. Calls answered after it do not undo it: a CLI
        refused at once compacts (OpenCode: a shorter summary request that fits) and sends its
        too-long prompt again, in a loop, until the timeout."""
        return next((o for o in self.overflows if o.after_calls == 0), None)

    @property
    def n_llm_calls(self) -> int:
        return sum(1 for c in self.calls if c.kind != "aborted")

    @property
    def n_truncations(self) -> int:
        return sum(1 for c in self.calls if c.truncated_tool_results)

    @property
    def n_altered_reasoning(self) -> int:
        """Calls whose history carried altered reasoning of a turn we sampled."""
        return sum(1 for c in self.calls if c.altered_reasoning)

    @property
    def n_tool_calls(self) -> int:
        """Tool calls the model emitted (counted at the proxy, harness-agnostic), excluding
        answers the client abandoned."""
        return sum(
            c.n_tool_calls
            for c in self.calls
            if c.kind != "aborted" and self.segments[c.segment].role != "discarded"
        )

    def to_dicts(self) -> list[dict[str, Any]]:
        return [s.to_dict() for s in self.segments]

    def snapshot(self) -> SessionTrace:
        """An independent copy (a closed session's late bookkeeping cannot change it)."""
        return copy.deepcopy(self)
