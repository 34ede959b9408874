from .reader import read_table
from .rows import split_row
from .table import Table

__all__ = ["Table", "read_table", "split_row"]
