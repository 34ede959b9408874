from .errors import PageOutOfRange
from .page import Page
from .paginator import Paginator

__all__ = ["Page", "PageOutOfRange", "Paginator"]
