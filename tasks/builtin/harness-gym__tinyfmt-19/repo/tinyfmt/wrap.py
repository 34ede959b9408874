import textwrap

from .paragraphs import split_paragraphs


def wrap_text(text: str, width: int = 72) -> str:
    """Wrap every paragraph of `text` to `width` columns."""
    if width < 1:
        raise ValueError("width must be positive")
    return "\n\n".join(
        textwrap.fill(" ".join(paragraph.split()), width=width)
        for paragraph in split_paragraphs(text)
    )
