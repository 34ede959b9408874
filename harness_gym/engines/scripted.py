"""`ScriptedEngine`: a policy whose words come from a script, with real tokens and real scores.

For tests and demonstrations that need a model to make specific moves (a tool call, a gold
patch): the script maps the prompt text to the answer text; the answer's tokens are the
tokenizer's encoding of that text plus the end-of-turn token, and each token's logprob is the
scoring model's teacher-forced log-probability of it, so traces from a scripted policy are as
real as a sampled one's to a trainer (re-scoring reproduces them).

Without a scoring model (`scorer=None`, a `tokenizer` given instead) every logprob is 0.0: the
tokens are demonstrations in that tokenizer, not samples from any model, and carry no p_old.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from .base import NO_CONTEXT, Engine, RequestContext, SamplingParams, TokenChunk
from .transformers_engine import TransformersEngine

Script = Callable[[str], str]
TASK_KEY_CHARS = 200  # how much of a problem statement identifies its task in a prompt


def task_key(problem_statement: str) -> str:
    """What a scripted policy looks for in a prompt to know which registered task it is on."""
    return problem_statement.strip()[:TASK_KEY_CHARS]


class ScriptedEngine(Engine):
    def __init__(
        self,
        scorer: TransformersEngine | None,
        script: Script,
        *,
        model_name: str = "scripted",
        tokenizer: Any = None,
        max_context: int | None = None,
        stop_token_ids: Sequence[int] | None = None,
        tokenizer_source: str | None = None,
    ) -> None:
        if scorer is None and (tokenizer is None or max_context is None or not stop_token_ids):
            raise ValueError("without a scorer, give the tokenizer, max_context and stop_token_ids")
        self.scorer = scorer
        self.script = script
        self.model_name = model_name
        self._tokenizer = tokenizer if tokenizer is not None else scorer.tokenizer
        self.max_context = max_context or scorer.max_context
        self.stop_token_ids = tuple(stop_token_ids or scorer.stop_token_ids)
        self.tokenizer_source = tokenizer_source or (scorer.tokenizer_source if scorer else None)
        if not self.stop_token_ids:
            raise ValueError("the scoring engine has no stop token to end a scripted turn with")
        # The template's end of turn when it is a stop token (ChatML), so a scripted turn ends
        # exactly as the policy's own turns do.
        im_end = self._tokenizer.get_vocab().get("<|im_end|>")
        self.end_of_turn_id = im_end if im_end in self.stop_token_ids else self.stop_token_ids[0]

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

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
        ids = ids[: room - 1] + [self.end_of_turn_id] if finish == "stop" else ids[:room]
        if self.scorer is not None:
            logprobs = await self.scorer.ascore(prompt, ids)
        else:
            logprobs = [0.0] * len(ids)
        for i, (token, logprob) in enumerate(zip(ids, logprobs)):
            yield TokenChunk([token], [logprob], finish if i == len(ids) - 1 else None)

    def close(self) -> None:
        if self.scorer is not None:
            self.scorer.close()
