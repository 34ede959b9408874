"""GRPO's group-relative advantage, computed from a grouped vector env's rewards."""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium.vector import VectorEnv, VectorWrapper

from ._flags import dropped, set_flag


class GroupRelativeAdvantage(VectorWrapper):
    """Adds `infos["advantage"]`: A_i = (R_i - mean_G) / (std_G + eps) within each group.

    Groups are runs of `group_size` consecutive sub-envs (the env's own `group_size` unless
    given), which `HarnessVectorEnv` gives the same task. std is the population std (ddof=0).
    Episodes flagged `drop` (infra errors, stale episodes) are left out of their group's
    statistics and get advantage 0. `infos["group_all_equal"]` flags every member of a group whose
    kept rewards are all equal: its advantages are all 0, so it carries no learning signal.

    On a vector env (Pi episodes: run in tests/test_wrappers.py, not here)::

        envs = GroupRelativeAdvantage(gym.make_vec(
            "HarnessSWE-v0", num_envs=4, group_size=2, engine="oracle",
            vectorization_mode="vector_entry_point", progress=False))
        _ = envs.reset(seed=0)
        _, rewards, _, _, infos = envs.step(None)
        infos["advantage"], infos["group_all_equal"]  # all 0, all True: the oracle always passes

    The computation itself, `group_advantages`:

        >>> advantages, all_equal = group_advantages(np.array([1.0, 0.0, 0.5, 0.5]), 2)
        >>> advantages.round(3), all_equal
        (array([ 1., -1.,  0.,  0.]), array([False, False,  True,  True]))
    """

    def __init__(self, env: VectorEnv, group_size: int | None = None, eps: float = 1e-6) -> None:
        super().__init__(env)
        self.group_size = group_size or getattr(env.unwrapped, "group_size", env.num_envs)
        if env.num_envs % self.group_size:
            raise ValueError(f"num_envs={env.num_envs} is not a multiple of "
                             f"group_size={self.group_size}")
        self.eps = eps

    def step(self, actions: Any):
        obs, rewards, terminations, truncations, infos = self.env.step(actions)
        advantage, all_equal = group_advantages(
            rewards, self.group_size, keep=~dropped(infos, self.num_envs), eps=self.eps)
        infos["advantage"] = advantage
        infos["_advantage"] = np.ones(self.num_envs, dtype=np.bool_)
        set_flag(infos, "group_all_equal", all_equal)
        return obs, rewards, terminations, truncations, infos


def group_advantages(
    rewards: np.ndarray, group_size: int, *, keep: np.ndarray | None = None, eps: float = 1e-6
) -> tuple[np.ndarray, np.ndarray]:
    """(advantages, group_all_equal) for rewards laid out in consecutive groups."""
    rewards = np.asarray(rewards, dtype=np.float64)
    keep = np.ones(len(rewards), dtype=np.bool_) if keep is None else np.asarray(keep)
    advantage = np.zeros(len(rewards), dtype=np.float64)
    all_equal = np.zeros(len(rewards), dtype=np.bool_)
    for start in range(0, len(rewards), group_size):
        idx = np.arange(start, start + group_size)[keep[start:start + group_size]]
        values = rewards[idx]
        if len(values) == 0 or np.all(values == values[0]):
            all_equal[start:start + group_size] = True
            continue
        advantage[idx] = (values - values.mean()) / (values.std() + eps)
    return advantage, all_equal
