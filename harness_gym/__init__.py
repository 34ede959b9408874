"""harness-gym: unmodified coding-agent CLIs as a Gymnasium environment, with token-faithful
traces.

    import gymnasium as gym
    import harness_gym  # registers HarnessSWE-v0

    env = gym.make("HarnessSWE-v0", harness="pi", engine="oracle")
"""

from __future__ import annotations

from gymnasium.envs.registration import register, registry

from . import _moved
from .rewards import RewardConfig

_moved.install()  # old flat module paths (harness_gym.ray_cluster, ...) keep importing

__version__ = "0.1.0"
ENV_ID = "HarnessSWE-v0"

if ENV_ID not in registry:
    # Traces carry sandbox paths and the CLIs' dates, so two runs are never bit-identical.
    register(id=ENV_ID, entry_point="harness_gym.env:HarnessSWEEnv", nondeterministic=True,
             vector_entry_point="harness_gym.vector_env:HarnessVectorEnv")


def __getattr__(name: str):
    if name == "EpisodeConfig":
        from .config import EpisodeConfig

        return EpisodeConfig
    if name == "HarnessSWEEnv":
        from .env import HarnessSWEEnv

        return HarnessSWEEnv
    if name == "RayCluster":  # imports Ray only when asked for
        from .scaleout.ray_cluster import RayCluster

        return RayCluster
    if name == "InterceptionProxy":
        from .proxy import InterceptionProxy

        return InterceptionProxy
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ENV_ID", "EpisodeConfig", "HarnessSWEEnv", "InterceptionProxy", "RayCluster",
           "RewardConfig", "__version__"]
