from .pattern import compile_pattern
from .router import NotFound, Router

__all__ = ["NotFound", "Router", "compile_pattern"]
