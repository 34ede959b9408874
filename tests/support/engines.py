"""Test-only engine helpers. They wrap real engines; nothing here fakes a model's numbers."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

from harness_gym.engines import Engine, RequestContext, SamplingParams, TokenChunk
from harness_gym.engines.base import NO_CONTEXT


class RecordingEngine(Engine):
    """Passes every call to a real engine and keeps what it returned, call by call."""

    def __init__(self, inner: Engine) -> None:
        self.inner = inner
        self.model_name = inner.model_name
        self.max_context = inner.max_context
        self.stop_token_ids = inner.stop_token_ids
        self.calls: list[dict[str, Any]] = []

    @property
    def tokenizer(self) -> Any:
        return self.inner.tokenizer

    def stream(
        self,
        prompt_ids: Sequence[int],
        sampling: SamplingParams,
        context: RequestContext = NO_CONTEXT,
    ) -> AsyncIterator[TokenChunk]:
        self.check_fits(len(prompt_ids))
        record = {"prompt_ids": list(prompt_ids), "token_ids": [], "logprobs": [],
                  "context": context, "sampling": sampling}
        self.calls.append(record)
        return self._stream(self.inner.stream(prompt_ids, sampling, context), record)

    async def _stream(self, inner: AsyncIterator[TokenChunk], record: dict[str, Any]) -> AsyncIterator[TokenChunk]:
        try:
            async for chunk in inner:
                record["token_ids"].extend(chunk.token_ids)
                record["logprobs"].extend(chunk.logprobs)
                yield chunk
        finally:
            await inner.aclose()


def tool_call_script(turns: int, tool: str = "bash"):
    """A script that calls `tool` on every turn but the last, then says it is done. The turn
    number is read from how many tool results the prompt already holds."""

    def script(prompt_text: str) -> str:
        done = prompt_text.count("<tool_response>")
        if done >= turns - 1:
            return "All done."
        call = {"name": tool, "arguments": {"command": f"echo step{done} > out{done}.txt"}}
        return f"Running step {done}.\n<tool_call>\n{json.dumps(call)}\n</tool_call>"

    return script


def shell_script(commands, tool: str = "bash", done: str = "All done."):
    """A script that runs `commands` through the harness's shell tool, one per turn, then says
    `done`. `commands` is a list, or a function of the prompt text that returns one (so one
    engine can play a different agent per task). The turn is read from how many tool results
    the prompt already holds."""

    def script(prompt_text: str) -> str:
        todo = commands(prompt_text) if callable(commands) else commands
        turn = prompt_text.count("<tool_response>")
        if turn >= len(todo):
            return done
        call = {"name": tool, "arguments": {"command": todo[turn]}}
        return f"Step {turn}.\n<tool_call>\n{json.dumps(call)}\n</tool_call>"

    return script
