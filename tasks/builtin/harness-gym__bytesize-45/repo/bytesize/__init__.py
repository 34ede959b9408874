from .report import usage_table
from .units import format_size

__all__ = ["format_size", "usage_table"]
