"""Flag episodes sampled by weights too old for an off-policy-tolerant trainer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import numpy as np
from gymnasium.vector import VectorEnv, VectorWrapper

from ._flags import set_flag, zero_loss_masks


class StalenessFilter(VectorWrapper):
    """Marks episodes whose oldest call lags `current_version` by more than `max_lag`.

    An async trainer keeps sampling while it updates the weights, so an episode can mix calls
    from several versions; its lag is `current - info["policy_version_min"]`. Stale episodes get
    `infos["stale"]` True and loss masks of all 0 (copies of their trace segments), so they add
    no gradient. `mode="drop"` also sets `infos["drop"]`: trainers skip the episode entirely and
    `GroupRelativeAdvantage` (wrapped outside this one) leaves it out of its group's baseline.
    `mode="mask"` keeps it in the baseline. `current_version` may be a callable, read each step.

    On a vector env (run in tests/test_wrappers.py)::

        envs = StalenessFilter(vec_env, current_version=lambda: trainer.version, max_lag=1)
        _, _, _, _, infos = envs.step({"policy_version": np.array([5, 4, 3, 3])})
        infos["stale"]          # trainer.version == 5: array([False, False,  True,  True])
    """

    def __init__(
        self,
        env: VectorEnv,
        current_version: int | Callable[[], int],
        max_lag: int = 1,
        mode: Literal["drop", "mask"] = "drop",
    ) -> None:
        super().__init__(env)
        if mode not in ("drop", "mask"):
            raise ValueError(f"mode must be 'drop' or 'mask', got {mode!r}")
        if max_lag < 0:
            raise ValueError("max_lag must be >= 0")
        self.current_version = current_version
        self.max_lag = max_lag
        self.mode = mode

    def step(self, actions: Any):
        obs, rewards, terminations, truncations, infos = self.env.step(actions)
        current = self.current_version() if callable(self.current_version) else self.current_version
        oldest = infos.get("policy_version_min", [None] * self.num_envs)
        stale = np.array([is_stale(current, v, self.max_lag) for v in oldest], dtype=np.bool_)
        set_flag(infos, "stale", stale)
        if "trace" in infos:
            zero_loss_masks(infos, stale)
        if self.mode == "drop":
            set_flag(infos, "drop", stale)
        return obs, rewards, terminations, truncations, infos


def is_stale(current: int, oldest: int | None, max_lag: int) -> bool:
    """Whether weights of version `oldest` (None: no call made) lag `current` by more than
    `max_lag` updates. The one staleness rule, shared with the asynchronous trainer loop.

        >>> is_stale(5, 3, max_lag=1), is_stale(5, 4, max_lag=1), is_stale(5, None, max_lag=0)
        (True, False, False)
    """
    return oldest is not None and current - int(oldest) > max_lag
