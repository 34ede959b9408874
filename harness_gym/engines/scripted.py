"""`ScriptedEngine`: a policy whose words come from a script, with real tokens and real scores.

For tests and demonstrations that need a model to make specific moves (a tool call, a gold
patch): the script maps the prompt text to the answer text; the answer's tokens are the scoring
model's tokenizer's encoding of that text plus the end-of-turn token, and each token's logprob is
the scoring model's teacher-forced log-probability of it, so traces from a scripted policy are
as real as a sampled one's to a trainer (re-scoring reproduces them).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from .base import NO_CONTEXT, Engine, RequestContext, SamplingParams, TokenChunk
from .transformers_engine import TransformersEngine

Script = Callable[[str], str]


class ScriptedEngine(Engine):
    def __init__(self, scorer: TransformersEngine, script: Script, *, model_name: str = "scripted") -> None:
        self.scorer = scorer
        self.script = script
        self.model_name = model_name
        self.max_context = scorer.max_context
        self.stop_token_ids = scorer.stop_token_ids
        self.tokenizer_source = scorer.tokenizer_source
        if not self.stop_token_ids:
            raise ValueError("the scoring engine has no stop token to end a scripted turn with")

    @property
    def tokenizer(self) -> Any:
        return self.scorer.tokenizer

    def stream(
        self,
        prompt_ids: Sequence[int],
        sampling: SamplingParams,
        context: RequestContext = NO_CONTEXT,
    ) -> AsyncIterator[TokenChunk]:
        self.check_fits(len(prompt_ids))
        return self._stream(list(prompt_ids), sampling)

    async def _stream(self, prompt: list[int], sampling: SamplingParams) -> AsyncIterator[TokenChunk]:
        text = self.script(self.tokenizer.decode(prompt, skip_special_tokens=False))
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        room = min(sampling.max_tokens, self.max_context - len(prompt))
        finish = "stop" if len(ids) < room else "length"
        ids = ids[: room - 1] + [self.stop_token_ids[0]] if finish == "stop" else ids[:room]
        logprobs = await self.scorer.ascore(prompt, ids)
        for i, (token, logprob) in enumerate(zip(ids, logprobs)):
            yield TokenChunk([token], [logprob], finish if i == len(ids) - 1 else None)

    def close(self) -> None:
        self.scorer.close()
