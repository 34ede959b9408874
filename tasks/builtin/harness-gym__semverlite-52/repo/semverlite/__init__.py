from .errors import InvalidVersion
from .ranges import satisfies
from .version import Version, parse

__all__ = ["InvalidVersion", "Version", "parse", "satisfies"]
