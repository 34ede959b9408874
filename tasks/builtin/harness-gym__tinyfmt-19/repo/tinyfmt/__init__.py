"""Re-wrap plain-text paragraphs to a width, keeping blank lines between them."""

from .paragraphs import split_paragraphs
from .wrap import wrap_text

__version__ = "1.3.0"
__all__ = ["fill_text", "split_paragraphs", "wrap_text", "__version__"]
