"""Per-episode flags in batched vector infos (`infos[key]` plus its `_key` mask)."""

from __future__ import annotations

from typing import Any

import numpy as np


def flag(infos: dict[str, Any], key: str, n: int) -> np.ndarray:
    """`infos[key]` as a bool array; False where absent."""
    if key not in infos:
        return np.zeros(n, dtype=np.bool_)
    mask = infos.get(f"_{key}", np.ones(n, dtype=np.bool_))
    return np.array([bool(v) and bool(m) for v, m in zip(infos[key], mask)], dtype=np.bool_)


def dropped(infos: dict[str, Any], n: int) -> np.ndarray:
    """Episodes a trainer should leave out: `infos["drop"]` or the reward's own drop flag."""
    return flag(infos, "drop", n) | flag(infos.get("reward_breakdown", {}), "drop", n)


def set_flag(infos: dict[str, Any], key: str, values: np.ndarray) -> None:
    """OR `values` into `infos[key]`, every env marked present."""
    infos[key] = flag(infos, key, len(values)) | values
    infos[f"_{key}"] = np.ones(len(values), dtype=np.bool_)


def zero_loss_masks(infos: dict[str, Any], which: np.ndarray) -> None:
    """Replace the traces of the `which` episodes by copies whose loss masks are all 0."""
    for i in np.flatnonzero(which):
        infos["trace"][i] = [dict(s, loss_mask=[0] * len(s["loss_mask"]))
                             for s in infos["trace"][i] or []]
