"""Keep our own failures out of the training batch: the model did nothing wrong."""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium.vector import VectorEnv, VectorWrapper

from ._flags import set_flag, zero_loss_masks


class DropInfraErrors(VectorWrapper):
    """Flags `infra_error` episodes with `infos["drop"]` and zeroes their loss masks.

    A sandbox that failed to start or a test patch that did not apply says nothing about the
    policy, yet its reward (0.0 under `infra_error="drop"`) would pull its group's baseline.
    With `omit=True` their traces are also replaced by `[]`, so a trainer that only reads traces
    cannot train on them by mistake.

    On a vector env (run in tests/test_wrappers.py)::

        envs = DropInfraErrors(vec_env)
        _, _, _, _, infos = envs.step(None)
        infos["drop"][infos["outcome"] == "infra_error"].all()  # True
    """

    def __init__(self, env: VectorEnv, omit: bool = False) -> None:
        super().__init__(env)
        self.omit = omit

    def step(self, actions: Any):
        obs, rewards, terminations, truncations, infos = self.env.step(actions)
        infra = np.array([o == "infra_error" for o in infos["outcome"]], dtype=np.bool_)
        set_flag(infos, "drop", infra)
        if "trace" in infos:
            zero_loss_masks(infos, infra)
            if self.omit:
                for i in np.flatnonzero(infra):
                    infos["trace"][i] = []
        return obs, rewards, terminations, truncations, infos
