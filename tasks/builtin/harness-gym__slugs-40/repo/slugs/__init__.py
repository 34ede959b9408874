from .slugify import slugify
from .truncate import truncate_at_separator

__all__ = ["slugify", "truncate_at_separator"]
