"""Which Ray nodes may hold a node runner, judged from what they have free now.

A runner asks for resources (its actor options: `num_cpus`, default 1, `num_gpus`, `memory`,
custom `resources`) and may ask for node labels. A node can host one if it is alive, carries
every label asked for and has at least the resources asked for in total; it can take one now
if it also has them free. Judging by free resources, not totals, is what lets several envs share
a cluster: a node whose CPUs another env's runners hold is left alone (issue 18 measured a second
env's `reset()` blocked for 64.5 s, pinned to nodes it could not fit on), and when no node can
take a runner the error says which resource or label each node lacks.

    >>> nodes = [{"NodeID": "aa", "Alive": True, "NodeManagerAddress": "10.0.0.5",
    ...           "Resources": {"CPU": 8.0, "rollout": 4.0}, "Labels": {"role": "rollout"}},
    ...          {"NodeID": "bb", "Alive": True, "NodeManagerAddress": "10.0.0.6",
    ...           "Resources": {"CPU": 8.0, "GPU": 8.0}, "Labels": {"role": "trainer"}}]
    >>> free = {"aa": {"CPU": 0.0, "rollout": 4.0}, "bb": {"CPU": 8.0, "GPU": 8.0}}
    >>> demand = runner_demand({"resources": {"rollout": 1}})
    >>> [(f.node_id, f.can_host, f.fits_now) for f in fit_nodes(nodes, free, demand, {})]
    [('aa', True, False), ('bb', False, False)]
    >>> print(placement_report(fit_nodes(nodes, free, demand, {}), demand, {}))
    a node runner asks for CPU 1, rollout 1
      aa (10.0.0.5): busy: CPU 0 of 8 free (other actors hold it: another env's runners?)
      bb (10.0.0.6): cannot host: no rollout
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# Options the executor sets itself: one runner per node, pinned there, restarted by us.
RESERVED_ACTOR_OPTIONS = frozenset({
    "name", "namespace", "max_concurrency", "scheduling_strategy", "lifetime", "max_restarts",
    "get_if_exists", "concurrency_groups",
})


class RayPlacementError(RuntimeError):
    """No Ray node could take (or start) a node runner; the message says what each lacks."""


def check_actor_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The user's actor options, with the ones the executor owns refused by name."""
    reserved = sorted(RESERVED_ACTOR_OPTIONS & set(options))
    if reserved:
        raise ValueError(
            f"ray actor option(s) {', '.join(reserved)} are set by the Ray executor (one runner "
            "per node, placed and replaced by it); choose nodes with `resources` in the actor "
            "options or with node_labels"
        )
    return dict(options)


def runner_demand(options: Mapping[str, Any]) -> dict[str, float]:
    """The resources one runner asks for, as Ray names them (`CPU`, `GPU`, `memory`, custom)."""
    demand = {"CPU": float(options.get("num_cpus", 1)), "GPU": float(options.get("num_gpus", 0)),
              "memory": float(options.get("memory", 0))}
    demand.update({str(k): float(v) for k, v in (options.get("resources") or {}).items()})
    return {k: v for k, v in demand.items() if v > 0}


@dataclass(frozen=True)
class NodeFit:
    """One alive node, judged against a runner's demand and labels."""

    node_id: str
    address: str
    total: dict[str, float]
    free: dict[str, float]
    missing_labels: dict[str, str | None] = field(default_factory=dict)  # asked: what it has
    lacking: tuple[str, ...] = ()  # resources it has too little of in total
    busy: tuple[str, ...] = ()  # resources it has, but not free now

    @property
    def can_host(self) -> bool:
        return not self.missing_labels and not self.lacking

    @property
    def fits_now(self) -> bool:
        return self.can_host and not self.busy

    def describe(self, demand: Mapping[str, float], labels: Mapping[str, str]) -> str:
        where = f"{self.node_id[:12]} ({self.address})"
        if not self.can_host:
            why = [f"label {k}={labels[k]} (has {v!r})" if v is not None else
                   f"no label {k}={labels[k]}" for k, v in self.missing_labels.items()]
            why += [f"no {r}" if self.total.get(r, 0) == 0 else
                    f"{r} {_n(self.total[r])} < {_n(demand[r])}" for r in self.lacking]
            return f"{where}: cannot host: {', '.join(why)}"
        if self.busy:
            held = ", ".join(f"{r} {_n(self.free.get(r, 0))} of {_n(self.total[r])} free"
                             for r in self.busy)
            return f"{where}: busy: {held} (other actors hold it: another env's runners?)"
        return f"{where}: can take a runner"


def _n(x: float) -> str:
    return f"{x:g}"


def fit_nodes(
    nodes: list[dict[str, Any]],
    free: Mapping[str, Mapping[str, float]],
    demand: Mapping[str, float],
    labels: Mapping[str, str],
) -> list[NodeFit]:
    """Judge every alive node of `ray.nodes()` with its free resources (node id -> resources,
    as `ray._private.state.available_resources_per_node()` answers; a resource at 0 is left
    out there)."""
    fits = []
    for node in nodes:
        if not node.get("Alive"):
            continue
        node_id = node["NodeID"]
        total = {k: float(v) for k, v in (node.get("Resources") or {}).items()}
        now = {k: float(v) for k, v in (free.get(node_id) or {}).items()}
        have = node.get("Labels") or {}
        fits.append(NodeFit(
            node_id=node_id,
            address=str(node.get("NodeManagerAddress", "?")),
            total=total,
            free=now,
            missing_labels={k: have.get(k) for k, v in labels.items() if have.get(k) != v},
            lacking=tuple(r for r, n in demand.items() if total.get(r, 0) < n),
            busy=tuple(r for r, n in demand.items() if total.get(r, 0) >= n > now.get(r, 0)),
        ))
    return fits


def placement_report(
    fits: list[NodeFit],
    demand: Mapping[str, float],
    labels: Mapping[str, str],
    failures: Mapping[str, str] | None = None,
) -> str:
    """What a runner asks for and, node by node, why it can or cannot take one."""
    asks = ", ".join(f"{r} {_n(n)}" for r, n in demand.items())
    if labels:
        asks += " on a node labelled " + ", ".join(f"{k}={v}" for k, v in labels.items())
    lines = [f"a node runner asks for {asks}"]
    for fit in fits:
        line = fit.describe(demand, labels)
        if failures and fit.node_id in failures:
            line += f"; its runner failed: {failures[fit.node_id]}"
        lines.append(f"  {line}")
    if not fits:
        lines.append("  (no alive node: is the cluster up? see `ray status`)")
    return "\n".join(lines)
