from .iterables import is_hashable, unique_everseen, unique_justseen

__all__ = ["is_hashable", "unique_everseen", "unique_justseen"]
