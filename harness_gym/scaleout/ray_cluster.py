"""`RayCluster`: where a vector env's episodes run on Ray, and how the executor treats the cluster.

The user's side of `ray_executor` (which imports this record, never the other way): which cluster,
which nodes (labels, resources), what each node runner asks for, and the executor's clocks. A plain
frozen record, so it can be built, checked and passed around (the TRL integration, an async trainer)
without Ray installed.

    >>> from harness_gym.config import EpisodeConfig
    >>> cluster = RayCluster(address="auto", actor_options={"resources": {"rollout": 1}},
    ...                      node_labels={"role": "rollout"}, deadline_margin_s=60)
    >>> cluster.deadline_s(EpisodeConfig(episode_timeout_s=600, test_timeout_s=120))
    780.0
    >>> RayCluster(actor_options={"scheduling_strategy": "SPREAD"})
    Traceback (most recent call last):
    ...
    ValueError: ray actor option(s) scheduling_strategy are set by the Ray executor ...
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..config import EpisodeConfig
from .ray_placement import check_actor_options


@dataclass(frozen=True)
class RayCluster:
    """Where and how episodes run on Ray: pass as `make_vec(..., executor=RayCluster(...))`.

    - `address`: a running cluster (`"auto"`, `"10.0.0.5:6379"`); None starts a local one with
      `init_kwargs` as extra `ray.init` keywords (also used to join, e.g. `runtime_env`).
    - `actor_options`: Ray options of every runner actor (`num_cpus`, default 1; `num_gpus`,
      `memory`, `resources`, `runtime_env`). A runner goes only on a node that has these
      resources free, so `{"resources": {"rollout": 1}}` keeps runners on nodes started with
      `ray start --resources='{"rollout": N}'`.
    - `node_labels`: only nodes carrying all of these labels (`ray start --labels=k=v`).
    - `start_timeout_s`: how long a runner may take to start (engine load, CLI install) and how
      long start-up and a queued episode wait for one.
    - `deadline_margin_s`: added to `episode_timeout_s + test_timeout_s` for an episode's
      deadline (sandbox start, repo copy, grading set-up).
    - `poll_s`: how often the cluster's membership is read; also the runners' heartbeat.
    - `max_reruns`: how often an episode lost before its first model call is run again.
    - `retry_s`: how long a node whose runner was lost or failed to start waits for the next
      one (doubling on each failure in a row, up to 10 min): a runner that crashes at once does
      not restart in a loop.
    """

    address: str | None = None
    init_kwargs: Mapping[str, Any] = field(default_factory=dict)
    actor_options: Mapping[str, Any] = field(default_factory=dict)
    node_labels: Mapping[str, str] = field(default_factory=dict)
    start_timeout_s: float = 300.0
    deadline_margin_s: float = 120.0
    poll_s: float = 5.0
    max_reruns: int = 2
    retry_s: float = 30.0

    def __post_init__(self) -> None:
        check_actor_options(self.actor_options)
        if min(self.start_timeout_s, self.poll_s) <= 0 or min(self.deadline_margin_s,
                                                               self.retry_s) < 0:
            raise ValueError("start_timeout_s and poll_s must be positive, deadline_margin_s "
                             "and retry_s not negative")
        if self.max_reruns < 0:
            raise ValueError(f"max_reruns must be >= 0, got {self.max_reruns}")

    def deadline_s(self, config: EpisodeConfig) -> float:
        """How long an episode sent to a node may take before it is an `infra_error`."""
        return config.episode_timeout_s + config.test_timeout_s + self.deadline_margin_s


@dataclass(frozen=True)
class EpisodePlacement:
    """Where one episode ran: every node it was sent to (a re-run adds one), whether it had
    made a model call there, and its outcome (None while it runs)."""

    key: str
    task_id: str
    harness: str
    nodes: tuple[str, ...]
    called: bool
    outcome: str | None
