from __future__ import annotations

import re

from .truncate import truncate_at_separator

_NOT_ALLOWED = re.compile(r"[^a-z0-9]+")


def slugify(text: str, *, separator: str = "-", max_length: int | None = None) -> str:
    """A URL-safe slug: lowercase ASCII letters and digits joined by `separator`."""
    slug = _NOT_ALLOWED.sub(separator, text.lower()).strip(separator)
    if max_length is not None:
        slug = truncate_at_separator(slug, max_length, separator)
    return slug
