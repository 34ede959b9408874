"""vLLM 0.33's `/v1/completions` wire, as `VLLMEngine` speaks it: request bodies, streamed chunks,
error answers. Pure functions over JSON, so each rule is testable alone.

Every fact here was read in the vLLM 0.33.0 wheel (docs/design.md, "vLLM 0.33 as read"); the
functions name the file they follow.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from .base import ContextLengthExceeded, EngineError, FinishReason, SamplingParams, TokenChunk

#: How the sampled ids come back. `logprobs` (default): `return_tokens_as_token_ids` makes
#: `logprobs.tokens` read `"token_id:123"`, one per sampled token, and nothing is echoed.
#: `echo`: `return_token_ids` adds `choices[0].token_ids` to every chunk, and also echoes the
#: whole prompt (`prompt_token_ids`, ~30k ids at turn 30 of an agent episode) on the first one.
IdsFrom = Literal["logprobs", "echo"]
IDS_FROM: tuple[IdsFrom, ...] = ("logprobs", "echo")

#: Sampling fields vLLM fills from the model's `generation_config.json` when a request leaves
#: them out (`ModelConfig.get_diff_sampling_param`, config/model.py; merged in
#: `CompletionRequest.to_sampling_params`: request value, else the server's default, else
#: vLLM's neutral one). Qwen2.5-Instruct ships `repetition_penalty: 1.05`: processed logprobs
#: would then include a penalty the trainer's re-score does not apply. So every request sends
#: all of them; these four carry no `SamplingParams` field and are always neutral.
NEUTRAL_PENALTIES: dict[str, float] = {
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "min_p": 0.0,
}
#: All the keys above, as vLLM names them in `get_diff_sampling_param` (`max_new_tokens` becomes
#: the request's `max_tokens`).
GENERATION_CONFIG_KEYS = (
    "repetition_penalty", "presence_penalty", "frequency_penalty", "temperature", "top_k",
    "top_p", "min_p", "max_tokens", "skip_special_tokens",
)

# `format_token_id_placeholder`, entrypoints/generate/base/serving.py
_TOKEN_ID_PREFIX = "token_id:"
TOKEN_ID_PATTERN = re.compile(r"token_id:-?\d+")
_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}


def completion_body(
    model: str,
    prompt: list[int],
    sampling: SamplingParams,
    stop_token_ids: list[int],
    ids_from: IdsFrom,
) -> dict[str, Any]:
    """The streamed `/v1/completions` request for a token prompt (field names of vLLM's
    `CompletionRequest`, entrypoints/openai/completion/protocol.py)."""
    return {"prompt": prompt, **completion_fields(model, sampling, stop_token_ids, ids_from)}


def completion_fields(
    model: str,
    sampling: SamplingParams,
    stop_token_ids: list[int],
    ids_from: IdsFrom,
) -> dict[str, Any]:
    """`completion_body` without the prompt (`encode_body` splices the prompt's JSON in)."""
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": sampling.max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,  # 0 disables (vLLM 0.33 still accepts -1 "quietly")
        **NEUTRAL_PENALTIES,
        "stop_token_ids": stop_token_ids,
        "logprobs": 0,  # the sampled token's logprob only
        # The text is unused (the proxy decodes the ids), but keep it equal to the ids' text.
        "skip_special_tokens": False,
        "include_stop_str_in_output": True,
        "return_weight_versions": True,
        "stream": True,
    }
    if ids_from == "logprobs":
        body["return_tokens_as_token_ids"] = True
    else:
        body["return_token_ids"] = True
    if sampling.seed is not None:
        body["seed"] = sampling.seed
    return body


def encode_body(fields: dict[str, Any], prompt_json: bytes) -> bytes:
    """The request's JSON: `fields` with the prompt's JSON array (from `PromptEncoder`) spliced
    in, so the ~30k prompt ids of a long episode are never serialised again."""
    return b'{"prompt":' + prompt_json + b"," + orjson.dumps(fields)[1:]


class PromptEncoder:
    """Token prompts as JSON arrays, incrementally per session.

    An agent's prompt at turn t+1 starts with its prompt and answer at turn t (the append-only
    bridge), so each session's last prompt and its JSON are kept and only the new tail is
    encoded: the cost of a call no longer grows with the episode (30k ids took ~2 ms with the
    stdlib's `json`, plus ~1.5 ms to copy them as ints). The prefix is compared id by id, so a
    prompt that does not extend the last one is simply encoded in full."""

    def __init__(self, max_sessions: int = 256) -> None:
        self.max_sessions = max_sessions
        self._last: OrderedDict[str, tuple[list[int], bytes]] = OrderedDict()

    def encode(self, prompt: Sequence[int], key: str | None = None) -> tuple[list[int], bytes]:
        """(the prompt as a list of ints, its JSON array)."""
        last = None if key is None else self._last.get(key)
        if last is not None and len(prompt) >= len(last[0]) and \
                prompt[: len(last[0])] == last[0]:
            ids, encoded = last
            tail = [int(t) for t in prompt[len(ids):]]
            if tail:
                ids = ids + tail
                encoded = encoded[:-1] + (b"," if len(encoded) > 2 else b"") + \
                    orjson.dumps(tail)[1:]
        else:
            ids = [int(t) for t in prompt]
            encoded = orjson.dumps(ids)
        if key is not None:
            self._last[key] = (ids, encoded)
            self._last.move_to_end(key)
            while len(self._last) > self.max_sessions:
                self._last.popitem(last=False)
        return ids, encoded


# --- the streamed answer ---------------------------------------------------------------------

_ECHO_KEY = b'"prompt_token_ids":['
_ID_BYTES = b"0123456789,- \t\r\n"


async def sse_data(pieces: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The payloads of an event stream's `data:` lines, as bytes: a ~200 KB first event (the
    prompt echo) is neither decoded to text nor split more than once."""
    buffer = b""
    async for piece in pieces:
        if b"\n" not in piece:
            buffer += piece
            continue
        *lines, buffer = (buffer + piece).split(b"\n")
        for line in lines:
            if line.startswith(b"data:"):
                yield line[5:].strip()
    if buffer.startswith(b"data:"):
        yield buffer[5:].strip()


def drop_prompt_echo(data: bytes) -> bytes:
    """A chunk's JSON with its echoed `prompt_token_ids` array cut out (set to null) unparsed:
    the ids recorded are the ones sent, and parsing ~30k echoed ids cost more than the rest of
    the call. Only a flat array of integers is cut; anything else is left for the parser."""
    at = data.find(_ECHO_KEY)
    if at < 0:
        return data
    start = at + len(_ECHO_KEY)
    end = data.find(b"]", start)
    if end < 0 or data[start:end].translate(None, _ID_BYTES):
        return data
    return data[:at] + b'"prompt_token_ids":null' + data[end + 1:]


@dataclass(frozen=True)
class WeightVersionSpan:
    """Output tokens `[start, end)` were sampled by the weights labelled `version`
    (`vllm.outputs.WeightVersionSpan`)."""

    version: str
    start: int
    end: int


def parse_chunk(
    payload: dict[str, Any], ids_from: IdsFrom
) -> tuple[TokenChunk, list[WeightVersionSpan] | None] | None:
    """One `CompletionStreamResponse` -> the tokens it adds, and the weight-version spans (the
    last chunk carries them). None for a chunk without choices (the usage chunk)."""
    choices = payload.get("choices")
    if not choices:
        return None
    choice = choices[0]
    logprobs = choice.get("logprobs") or {}
    values = logprobs.get("token_logprobs") or []
    if ids_from == "logprobs":
        token_ids = _ids_from_tokens(logprobs.get("tokens") or [])
    else:
        token_ids = choice.get("token_ids") or []
    if len(values) != len(token_ids) or (ids_from == "echo" and "token_ids" not in choice):
        raise EngineError(
            f"vLLM sent {len(token_ids)} token ids with {len(values)} logprobs: does the server "
            "honour `logprobs: 0` and `return_token_ids` (vLLM >= 0.10.2)?"
        )
    reason = choice.get("finish_reason")
    finish = None if reason is None else _FINISH.get(reason, "abort")
    spans = choice.get("weight_versions")
    parsed = None if spans is None else [
        WeightVersionSpan(str(s["version"]), int(s["start"]), int(s["end"])) for s in spans
    ]
    return TokenChunk(token_ids, values, finish), parsed


def _ids_from_tokens(tokens: list[str]) -> list[int]:
    if all(token.startswith(_TOKEN_ID_PREFIX) for token in tokens):
        return [int(token[len(_TOKEN_ID_PREFIX):]) for token in tokens]
    raise EngineError(
        f"vLLM sent logprobs tokens {tokens[:3]!r}, not 'token_id:N': the server ignored "
        "`return_tokens_as_token_ids` (use ids_from='echo' with this server)"
    )


def policy_version_of(spans: list[WeightVersionSpan] | None) -> int | None:
    """The version to record for a call: the oldest integer label among its spans (a call that
    straddled a weight update counts as its oldest tokens' policy, the conservative reading for
    staleness). None when no span carries an integer label (vLLM starts at "default")."""
    versions = [int(s.version) for s in spans or () if _is_int(s.version)]
    return min(versions, default=None)


def _is_int(text: str) -> bool:
    return text.strip().lstrip("+-").isdigit()


# --- errors --------------------------------------------------------------------------------

class RetryElsewhere(Exception):
    """A failure before any token that another server (or a later try) may not have."""


# The wordings of a prompt that does not fit, as vLLM 0.33 writes them.
# renderers/params.py `TokenizeParams._token_len_check` (param "input_tokens"):
#   "This model's maximum context length is N tokens. However, your prompt contains [at least ]M
#    input tokens, which exceeds this limit even without any output tokens. ..."
# renderers/params.py `_text_len_check` (param "input_text", text prompts only):
#   "... However, your prompt contains C characters (more than ...)"
# entrypoints/serve/utils/api_utils.py `get_max_tokens` (a ValueError -> 400):
#   "Input length (M) exceeds model's maximum context length (N)."
# vLLM before the renderer rewrite (kept for older servers):
#   "... However, you requested M tokens (P in the messages, C in the completion). ..."
_CONTEXT_WORDINGS = (
    re.compile(r"maximum context length is (?P<limit>\d+) tokens\. However, your prompt contains "
               r"(?:at least )?(?P<prompt>\d+) input tokens"),
    re.compile(r"maximum context length is (?P<limit>\d+) tokens\. However, your prompt contains "
               r"\d+ characters"),
    re.compile(r"Input length \((?P<prompt>\d+)\) exceeds model's maximum context length "
               r"\((?P<limit>\d+)\)"),
    re.compile(r"maximum context length is (?P<limit>\d+) tokens\. However, you requested "
               r"(?P<prompt>\d+) tokens"),
)
# A prompt of exactly max_model_len tokens passes the length check; `get_max_tokens` then leaves
# 0 tokens to generate and `SamplingParams._verify_args` (sampling_params.py) rejects that.
_NO_ROOM = re.compile(r"max_tokens must be at least 1, got 0")
# `TokenizeParams.__post_init__`: the request's max_tokens alone exceeds the context.
_MAX_TOKENS_OVER = re.compile(
    r"max_tokens=(?P<asked>\d+) cannot be greater than max_model_len=(?P<limit>\d+)")


def error_for(status: int, body: str, url: str, prompt_tokens: int) -> Exception:
    """What an HTTP error answer from `url` means for the caller: `ContextLengthExceeded`,
    `RetryElsewhere` (a 5xx: the server is dead, overloaded or paused), or `EngineError`."""
    message, param = error_message(body)
    if status >= 500:
        return RetryElsewhere(f"HTTP {status}: {message}")
    for wording in _CONTEXT_WORDINGS:
        found = wording.search(message)
        if found:
            prompt = int(found.groupdict().get("prompt") or prompt_tokens)
            return ContextLengthExceeded(prompt, int(found["limit"]))
    if _NO_ROOM.search(message):
        return ContextLengthExceeded(prompt_tokens, prompt_tokens)
    over = _MAX_TOKENS_OVER.search(message)
    if over:
        return EngineError(
            f"{url} serves a context of {over['limit']} tokens, less than this engine's "
            f"max_context: leave max_context unset (it is read from /v1/models) or pass "
            f"max_context={over['limit']}"
        )
    if status == 404 and param == "model":
        return EngineError(f"{url}: {message} Pass the served name as model= ('vllm:URL?model=')")
    return EngineError(f"{url} answered HTTP {status}: {message}")


def stream_error(payload: dict[str, Any], url: str) -> Exception:
    """An `{"error": ...}` event inside a 200 stream (vLLM's `create_streaming_error_response`):
    a paused engine (503) or a generation error (500) before the first token can be retried."""
    error = payload.get("error")
    code = error.get("code") if isinstance(error, dict) else None
    message, _ = error_message(json.dumps(payload))
    if isinstance(code, int) and code >= 500:
        return RetryElsewhere(f"in-stream error {code}: {message}")
    return EngineError(f"{url} failed mid-stream: {message}")


def error_message(body: str) -> tuple[str, str | None]:
    """(message, param) of vLLM's `ErrorResponse` (`{"error": {"message", "type", "param",
    "code"}}`), or the raw text of anything else."""
    try:
        payload = json.loads(body)
    except ValueError:
        return body[:500], None
    error = payload.get("error", payload) if isinstance(payload, dict) else payload
    if isinstance(error, dict):
        return str(error.get("message", error)), error.get("param")
    return str(error), None
