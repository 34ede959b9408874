def _plural(count: int, unit: str) -> str:
    return f"{count} {unit}" if count == 1 else f"{count} {unit}s"


def phrase_for(days: int) -> str:
    """Words for an offset in days: 0 -> 'today', -1 -> 'yesterday', 15 -> 'in 2 weeks'."""
    if days == 0:
        return "today"
    if days == 1:
        return "tomorrow"
    if days == -1:
        return "yesterday"
    amount = abs(days)
    span = _plural(amount, "day") if amount < 14 else _plural(amount // 7, "week")
    return f"in {span}" if days > 0 else f"{span} ago"
