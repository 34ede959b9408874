from .interval import Interval
from .merge import merge, total_length

__all__ = ["Interval", "merge", "total_length"]
