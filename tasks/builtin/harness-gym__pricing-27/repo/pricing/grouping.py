def group_thousands(digits: str, separator: str = ",") -> str:
    """'1234567' -> '1,234,567'."""
    if not digits.isdigit():
        raise ValueError(f"expected digits, got {digits!r}")
    head = len(digits) % 3 or 3
    groups = [digits[:head]] + [digits[i : i + 3] for i in range(head, len(digits), 3)]
    return separator.join(groups)
