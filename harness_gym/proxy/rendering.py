"""Where canonical messages become prompt token ids, through the engine's own chat template.

Two ways in:
- `render_full`: the whole conversation, for a call that extends nothing we sampled.
- `render_after`: only the messages that follow an assistant turn we generated. The template is
  rendered over a tiny stand-in conversation (one placeholder user turn, our assistant turn, the
  new messages) and the text before the new messages is cut away, so the cost is independent of
  the history's length and earlier tokens are never re-tokenized. What the template writes after
  the end-of-turn token (ChatML's "\\n" after `<|im_end|>`) is the `turn_tail`, computed once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from transformers.utils.chat_template_utils import render_jinja_template

from .canonical import Message, ToolSpec

_PLACEHOLDER_USER = {"role": "user", "content": "."}


class TemplateNotIncremental(RuntimeError):
    """The chat template renders earlier turns differently once later ones are added, so the
    new messages cannot be rendered on their own; the caller renders in full and forks."""


class PromptRenderer:
    def __init__(self, tokenizer: Any, stop_token_ids: Sequence[int]) -> None:
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

    def encode(self, text: str) -> list[int]:
        return self._encode(text)

    def _pick_encoder(self):
        # The Rust tokenizer directly: transformers' wrapper adds ~50% to every call and gives
        # the same ids (checked at start-up below).
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None:
            probe = "<|im_start|>user\nçé 中文 \t  x\n\n"
            if backend.encode(probe, add_special_tokens=False).ids == self.tokenizer.encode(
                probe, add_special_tokens=False
            ):
                return lambda text: backend.encode(text, add_special_tokens=False).ids
        return lambda text: self.tokenizer.encode(text, add_special_tokens=False)

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

    def render_full(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> list[int]:
        text = self.render_text(
            [m.template_dict() for m in messages], [t.template_dict() for t in tools]
        )
        return self.encode(text)

    def render_after(
        self, assistant: Message, new_messages: Sequence[Message], turn_closed: bool
    ) -> list[int]:
        """Ids of what follows our sampled assistant turn: the end-of-turn token when sampling
        stopped without one (max_tokens), the template's turn tail, the new messages and the
        generation prompt."""
        stand_in = [_PLACEHOLDER_USER, assistant.template_dict()]
        before = self.render_text(stand_in, add_generation_prompt=False)
        after = self.render_text(stand_in + [m.template_dict() for m in new_messages])
        if not after.startswith(before):
            raise TemplateNotIncremental(
                "the chat template re-renders the assistant turn when messages follow it"
            )
        text = self.turn_tail + after[len(before) :]
        if not turn_closed:
            text = self.end_of_turn_text + text
        return self.encode(text)

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
