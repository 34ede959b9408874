"""Incremental detokenization: text deltas from streamed token ids.

Decoding each token alone breaks multi-byte characters and the spaces BPE merges into tokens;
decoding everything each step is quadratic. As in vLLM, decode a short window twice (with and
without the newest tokens) and emit the difference, holding back a trailing U+FFFD until the
character's remaining bytes arrive.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any, *, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0
        self._read = 0

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(
            ids, skip_special_tokens=self._skip_special_tokens, clean_up_tokenization_spaces=False
        )

    def push(self, token_ids: Sequence[int]) -> str:
        self._ids.extend(token_ids)
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        if after.endswith("\ufffd"):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return after[len(before) :]

    def flush(self) -> str:
        """Whatever is still held back at the end of the stream (a truncated character)."""
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return after[len(before) :]
