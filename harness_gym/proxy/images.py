"""Images (and documents) in user messages and tool results, for text-only and multimodal models.

Claude Code answers a `Read` of a PNG with an `image` block inside a `tool_result`; CLIs attach
screenshots to user turns. A 400 there would end the episode, so every dialect accepts them:

- Each becomes an `ImagePart` and, in the message's text, a placeholder that says what was there
  (`[image omitted: image/png, 1.2 KB, sha256 3f2a…; this model reads text only]`). A text-only
  policy is shown that placeholder: it is rendered and tokenized like any text, so the trace's
  prompt ids record exactly what the model saw. The digest keeps two different images apart, so
  a changed image is a changed history for the bridge.
- A multimodal engine (`Engine.accepts_images`) gets the parts instead: the message's content is
  passed to its chat template as a list of `{"type": "text"}` / `{"type": "image"}` parts, the
  shape Hugging Face's vision-language templates read.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ImagePart:
    """An image (or document) a client sent: inline base64 `data`, or a `url`."""

    media_type: str  # "image/png"; "" when only a URL says what it is
    data: str = ""  # base64, for inline images
    url: str = ""
    kind: str = "image"  # "image" | "document"

    @property
    def size(self) -> int:
        """Bytes of the decoded payload (0 for a URL)."""
        return len(self.data) * 3 // 4 - self.data[-2:].count("=") if self.data else 0

    @property
    def digest(self) -> str:
        return hashlib.sha256((self.data or self.url).encode()).hexdigest()[:12]

    def placeholder(self) -> str:
        what = ", ".join(filter(None, [self.media_type or "unknown type",
                                        _size_text(self.size) if self.data else "by URL"]))
        return f"[{self.kind} omitted: {what}, sha256 {self.digest}; this model reads text only]"

    def template_part(self) -> dict[str, Any]:
        """The part a vision-language chat template reads."""
        source = self.url or f"data:{self.media_type};base64,{self.data}"
        return {"type": self.kind, self.kind: source}


Part = str | ImagePart


def text_with_placeholders(parts: Sequence[Part], joiner: str = "") -> str:
    """The message's text as a text-only model reads it."""
    return joiner.join(p if isinstance(p, str) else p.placeholder() for p in parts)


def parts_with_images(parts: Sequence[Part]) -> tuple[Part, ...]:
    """What a `Message` keeps as `parts`: the parts when an image is among them, else nothing
    (its `content` says it all)."""
    return tuple(parts) if any(isinstance(p, ImagePart) for p in parts) else ()


def template_content(parts: Sequence[Part]) -> list[dict[str, Any]]:
    """The message's content as a multimodal chat template reads it."""
    return [{"type": "text", "text": p} if isinstance(p, str) else p.template_part()
            for p in parts if p != ""]


def from_data_url(url: str, kind: str = "image") -> ImagePart:
    """An OpenAI `image_url` (a `data:` URL carries the bytes inline)."""
    if url.startswith("data:") and ";base64," in url:
        head, data = url[5:].split(";base64,", 1)
        return ImagePart(head, data, kind=kind)
    return ImagePart("", url=url, kind=kind)


def _size_text(size: int) -> str:
    return f"{size} B" if size < 1024 else f"{size / 1024:.1f} KB"
