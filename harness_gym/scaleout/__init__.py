"""The scale-out wing: where a vector step's episodes run.

`executors` (the `EpisodeExecutor` seam and local threads) and, on Ray, `ray_cluster` (the
user's record of which cluster and how), `ray_executor` (the driver's side: placement, deadlines,
lost nodes), `ray_placement` (which nodes fit), `node_runner` (the actor on each node) and
`runner_workspace` (its files and processes, left behind by nothing). Ray is imported only when
a cluster is really used.
"""

from __future__ import annotations

from .ray_cluster import RayCluster

__all__ = ["RayCluster"]
