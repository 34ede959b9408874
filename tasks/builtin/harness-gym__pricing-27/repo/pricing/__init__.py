from .format import format_price
from .grouping import group_thousands
from .totals import Line, invoice_total

__all__ = ["Line", "format_price", "group_thousands", "invoice_total"]
