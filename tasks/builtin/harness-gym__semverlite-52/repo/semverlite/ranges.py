from __future__ import annotations

import operator

from .version import Version, parse

_OPERATORS = {
    ">=": operator.ge,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    "<": operator.lt,
}


def satisfies(version: str | Version, spec: str) -> bool:
    """True if `version` meets every comma-separated clause of `spec` (e.g. '>=1.2.0,<2.0.0')."""
    if isinstance(version, str):
        version = parse(version)
    for clause in spec.split(","):
        clause = clause.strip()
        for symbol, compare in _OPERATORS.items():
            if clause.startswith(symbol):
                if not compare(version, parse(clause[len(symbol) :])):
                    return False
                break
        else:
            raise ValueError(f"unknown operator in {clause!r}")
    return True
