from .decorator import retry
from .errors import RetryError

__all__ = ["RetryError", "retry"]
