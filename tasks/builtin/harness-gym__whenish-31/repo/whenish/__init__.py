from .relative import days_between, describe
from .wording import phrase_for

__all__ = ["days_between", "describe", "phrase_for"]
