def truncate_at_separator(slug: str, max_length: int, separator: str = "-") -> str:
    """Shorten `slug` to at most `max_length`, cutting at a separator when there is one."""
    if max_length < 1:
        raise ValueError("max_length must be at least 1")
    if len(slug) <= max_length:
        return slug
    cut = slug[: max_length + 1]
    if separator in cut:
        return cut[: cut.rindex(separator)].rstrip(separator)
    return slug[:max_length]
