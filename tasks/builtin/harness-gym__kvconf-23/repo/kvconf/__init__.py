from .config import Config
from .errors import ParseError
from .parser import parse

__all__ = ["Config", "ParseError", "parse"]
