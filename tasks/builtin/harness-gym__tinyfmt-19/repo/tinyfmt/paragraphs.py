import re

_BLANK_LINES = re.compile(r"\n\s*\n")


def split_paragraphs(text: str) -> list[str]:
    """Paragraphs are separated by one or more blank lines."""
    return [part.strip() for part in _BLANK_LINES.split(text) if part.strip()]
