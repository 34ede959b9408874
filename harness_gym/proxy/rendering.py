"""Where canonical messages become prompt token ids, through the engine's own chat template.

Two ways in:
- `render_full`: the whole conversation, for a call that extends nothing we sampled.
- `render_after`: only the messages that follow an assistant turn we generated. The template is
  rendered over a tiny stand-in conversation (one placeholder user turn, our assistant turn, the
  new messages) and everything up to our turn's end-of-turn token is cut away, so the cost is
  independent of the history's length and earlier tokens are never re-tokenized. What the
  template writes after the end-of-turn token (ChatML's "\\n" after `<|im_end|>`) is the
  `turn_tail`; it starts the rendered text, since sampling stops at the end-of-turn token.

Tokenizing is bounded by a token budget, not by the request's size: a 4 MB text took 6 s and
800 MB in one `encode` call (measured), so long texts are encoded piece by piece, split after
each end-of-turn token (an added token: the tokenizer splits there itself, so the ids are the
same), and a request that is clearly over budget stops early with `PromptTooLong`. Long texts
go through `encode_batch_fast`, which releases the GIL, so other sessions' calls keep running.

Whole turns (pieces that end with that token) of a few KB or more are kept with their ids
(`turn_ids_cache`, shared by the proxy's sessions): every episode of a CLI opens with the same
system prompt and tool list (Claude Code's ~78 KB, ~12k tokens of the shared benchmark's 47 KB
opening took 20-25 ms to tokenize), and a session that forks (compaction) renders its earlier
turns again. A cached piece's ids are what encoding that exact text gave.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from transformers.utils.chat_template_utils import render_jinja_template

from .canonical import Message, ToolSpec
from .lru import BoundedLRU
from .reasoning import without_reasoning

_PLACEHOLDER_USER = {"role": "user", "content": "."}
_SHORT_TEXT = 256  # chars: below this the plain `encode` is quicker than the batch call
_WINDOW = 128 * 1024  # chars: a longer piece is first counted window by window
_COUNT_WINDOW = 32 * 1024  # chars counted at a time (how far past a limit counting may go)
_WINDOW_SLACK = 8  # tokens a window boundary may add or remove versus the whole piece
_CACHED_PIECE_CHARS = 2048  # a whole turn at least this long is kept with its ids
_CACHED_TOKENS = 1 << 20  # ids kept in all (a few MB; the oldest turns go first)
# Tokens by which a message's text counted alone, joined to the next by "\n", can exceed its
# share of the rendered prompt (a newline, and merges into the template text at both edges).
_MESSAGE_SLACK = 5


class PromptTooLong(Exception):
    """Tokenizing stopped early: the text has at least `prompt_tokens` tokens, more than the
    budget it was given."""

    def __init__(self, prompt_tokens: int) -> None:
        super().__init__(f"at least {prompt_tokens} tokens")
        self.prompt_tokens = prompt_tokens


class TemplateNotIncremental(RuntimeError):
    """The chat template renders earlier turns differently once later ones are added, so the
    new messages cannot be rendered on their own; the caller renders in full and forks."""


def turn_ids_cache(max_tokens: int = _CACHED_TOKENS) -> BoundedLRU[tuple[int, ...]]:
    """Ids of whole rendered turns, by their text, bounded by the number of ids held."""
    return BoundedLRU(max_tokens, weight=len)


class PromptRenderer:
    def __init__(
        self, tokenizer: Any, stop_token_ids: Sequence[int], *, multimodal: bool = False
    ) -> None:
        """`multimodal`: the template is given images as content parts (`images` module);
        otherwise each image is its text placeholder."""
        self.multimodal = multimodal
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the engine's tokenizer has no chat template")
        self.tokenizer = tokenizer
        self._template = tokenizer.chat_template
        self._template_vars = {
            k: v for k, v in tokenizer.special_tokens_map.items() if isinstance(v, str)
        }
        self.stop_token_ids = frozenset(stop_token_ids)
        self._encode = self._pick_encoder()
        self.end_of_turn_text, self.turn_tail = self._find_turn_end()
        self.end_of_turn_ids = self.encode(self.end_of_turn_text)
        self._split_marker = self._pick_split_marker()
        self.turn_ids = turn_ids_cache()

    def encode(self, text: str, budget: int | None = None) -> list[int]:
        """The ids of `text`; with a `budget`, `PromptTooLong` once they clearly exceed it
        (the work done before stopping is about `budget` tokens, whatever the text's size)."""
        # A token covers at least one UTF-8 byte, at most 4 per character.
        fits = budget is None or 4 * len(text) <= budget
        if fits and len(text) < 2 * _CACHED_PIECE_CHARS:
            return self._encode(text)
        ids: list[int] = []
        marker = self._split_marker
        for piece in self._pieces(text):
            whole_turn = marker is not None and len(piece) >= _CACHED_PIECE_CHARS \
                and piece.endswith(marker)
            cached = self.turn_ids.get(piece) if whole_turn else None
            if cached is not None:
                ids.extend(cached)
            else:
                if not fits and len(piece) > _WINDOW and 4 * len(piece) > budget - len(ids):
                    self._count_windows(piece, budget - len(ids), len(ids))
                piece_ids = self._encode(piece)
                if whole_turn:
                    self.turn_ids.put(piece, tuple(piece_ids))
                ids.extend(piece_ids)
            if budget is not None and len(ids) > budget:
                raise PromptTooLong(len(ids))
        return ids

    def _pieces(self, text: str) -> list[str]:
        marker = self._split_marker
        if marker is None or marker not in text:
            return [text]
        parts = text.split(marker)
        return [part + marker for part in parts[:-1]] + ([parts[-1]] if parts[-1] else [])

    def _count_windows(self, piece: str, left: int, before: int) -> None:
        """Raise `PromptTooLong` if `piece` clearly has more than `left` tokens; encoding it
        whole would cost memory in proportion to its size."""
        over = self._clearly_more_than(piece, left)
        if over is not None:
            raise PromptTooLong(before + over)

    def _clearly_more_than(self, text: str, limit: int, slack: int = 0) -> int | None:
        """A lower bound on the tokens of `text` once that bound passes `limit` (None if it
        never does), counted window by window and stopping as soon as it is clear. `slack`:
        tokens the caller's own boundaries may account for."""
        count = boundaries = 0
        for start in range(0, len(text), _COUNT_WINDOW):
            count += len(self._encode(text[start : start + _COUNT_WINDOW]))
            boundaries += 1
            bound = count - _WINDOW_SLACK * boundaries - slack
            if bound > limit:
                return bound
        return None

    def _refuse_clearly_too_long(self, messages: Sequence[Message], budget: int | None) -> None:
        """Before rendering many times the budget's worth of text (the template engine holds
        the GIL the whole time), check the messages' text alone: the prompt holds all of it,
        so if it is clearly over the budget, so is the prompt."""
        if budget is None or sum(len(m.content) for m in messages) <= 2 * budget:
            return
        over = self._clearly_more_than(
            "\n".join(m.content for m in messages), budget, _MESSAGE_SLACK * len(messages))
        if over is not None:
            raise PromptTooLong(over)

    def _pick_encoder(self) -> Callable[[str], list[int]]:
        # The Rust tokenizer directly: transformers' wrapper adds ~50% to every call and gives
        # the same ids (checked here). `encode_batch_fast` (no offsets) is faster from a few
        # hundred characters on and releases the GIL while it works.
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None:
            long_probe = "<|im_start|>user\nçé 中文 \t  x\n\n" * 20
            short_probe = long_probe[:40]
            fast = getattr(backend, "encode_batch_fast", backend.encode_batch)

            def encode(text: str) -> list[int]:
                if len(text) < _SHORT_TEXT:
                    return backend.encode(text, add_special_tokens=False).ids
                return fast([text], add_special_tokens=False)[0].ids

            if all(encode(p) == self.tokenizer.encode(p, add_special_tokens=False)
                   for p in (short_probe, long_probe)):
                return encode
        return lambda text: self.tokenizer.encode(text, add_special_tokens=False)

    def _pick_split_marker(self) -> str | None:
        """The end-of-turn text, if the tokenizer splits its input there by itself (an added
        token that strips nothing around it), so pieces split after it encode to the same ids."""
        marker = self.end_of_turn_text
        ids = self._encode(marker)
        if len(ids) != 1:
            return None
        added = getattr(self.tokenizer, "added_tokens_decoder", {}).get(ids[0])
        if added is None or added.lstrip or added.rstrip or added.single_word:
            return None
        probe = f"a {marker}\n b\n{marker} \n{marker}{marker}x"
        whole = self._encode(probe)
        parts = probe.split(marker)
        pieces = [p + marker for p in parts[:-1]] + [parts[-1]]
        if [i for p in pieces for i in self._encode(p)] != whole:
            return None
        return marker

    def render_text(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> str:
        rendered, _ = render_jinja_template(
            conversations=[list(messages)],
            tools=list(tools) if tools else None,
            chat_template=self._template,
            add_generation_prompt=add_generation_prompt,
            **self._template_vars,
        )
        return rendered[0]

    def render_full(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], budget: int | None = None
    ) -> list[int]:
        self._refuse_clearly_too_long(messages, budget)
        text = self.render_text(
            [m.template_dict(self.multimodal) for m in messages], [t.template_dict() for t in tools]
        )
        return self.encode(text, budget)

    def render_after(
        self,
        assistant: Message,
        new_messages: Sequence[Message],
        turn_closed: bool,
        budget: int | None = None,
    ) -> list[int]:
        """Ids of what follows our sampled assistant turn: the end-of-turn token when sampling
        stopped without one (max_tokens), the template's turn tail, the new messages and the
        generation prompt.

        The turn itself is not re-rendered (its sampled ids are reused), so only where it ends
        matters: at the same count of end-of-turn markers as in the stand-in conversation
        alone. That holds also for templates that render a turn differently once messages
        follow it (Qwen3 drops earlier reasoning and the empty `<think></think>` of a last
        turn); the stand-in turn carries no reasoning, which only moves text inside it."""
        self._refuse_clearly_too_long(new_messages, budget)
        stand_in = [_PLACEHOLDER_USER, without_reasoning(assistant).template_dict()]
        before = self.render_text(stand_in, add_generation_prompt=False)
        after = self.render_text(
            stand_in + [m.template_dict(self.multimodal) for m in new_messages])
        marker = self.end_of_turn_text
        turns = before.count(marker)
        earlier = _end_of_nth(before, marker, turns - 1)  # where our turn starts, about
        end = _end_of_nth(after, marker, turns)
        if turns == 0 or end is None or after[:earlier] != before[:earlier]:
            raise TemplateNotIncremental(
                "the chat template renders the turns before the new messages differently "
                "once they are added"
            )
        text = after[end:]
        if not turn_closed:
            text = marker + text
        return self.encode(text, budget)

    def _find_turn_end(self) -> tuple[str, str]:
        """The end-of-turn marker the template writes after an assistant turn, and the text it
        writes after that marker."""
        turn = self.render_text(
            [_PLACEHOLDER_USER, {"role": "assistant", "content": "x"}], add_generation_prompt=False
        )
        for token_id in sorted(self.stop_token_ids):
            marker = self.tokenizer.decode([token_id])
            at = turn.rfind(marker)
            if marker and at >= 0:
                return marker, turn[at + len(marker) :]
        raise ValueError(
            "none of the engine's stop tokens appears in the template's assistant turn; "
            "set the engine's stop_token_ids to the template's end-of-turn token"
        )


def _end_of_nth(text: str, marker: str, n: int) -> int | None:
    """The index just past the `n`-th occurrence of `marker` in `text` (0 for n == 0), or None
    when there are fewer."""
    end = 0
    for _ in range(n):
        at = text.find(marker, end)
        if at < 0:
            return None
        end = at + len(marker)
    return end
