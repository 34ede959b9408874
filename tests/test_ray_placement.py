"""Which nodes may hold a runner, judged from `ray.nodes()` and the nodes' free resources (the
shapes Ray 2.60 answers; the real cluster runs in tests/test_ray_cluster.py)."""

from __future__ import annotations

import pytest

from harness_gym.scaleout.ray_cluster import RayCluster
from harness_gym.scaleout.ray_placement import (
    check_actor_options,
    fit_nodes,
    placement_report,
    runner_demand,
)


def node(node_id, resources, labels=None, alive=True):
    return {"NodeID": node_id, "Alive": alive, "NodeManagerAddress": f"10.0.0.{len(node_id)}",
            "Resources": resources, "Labels": {"ray.io/node-id": node_id, **(labels or {})}}


NODES = [
    node("head", {"CPU": 4.0, "memory": 8e9}),
    node("rollout-a", {"CPU": 8.0, "rollout": 2.0, "memory": 8e9}, {"role": "rollout"}),
    node("rollout-b", {"CPU": 8.0, "rollout": 2.0, "memory": 8e9}, {"role": "rollout"}),
    node("trainer", {"CPU": 8.0, "GPU": 8.0, "memory": 8e9}, {"role": "trainer"}),
    node("gone", {"CPU": 8.0, "rollout": 2.0}, {"role": "rollout"}, alive=False),
]
# rollout-b's rollout slots are held by another env's runners; Ray leaves a used-up resource out
FREE = {"head": {"CPU": 4.0, "memory": 8e9}, "rollout-a": {"CPU": 8.0, "rollout": 2.0},
        "rollout-b": {"CPU": 6.0}, "trainer": {"CPU": 8.0, "GPU": 8.0}}


def test_a_runner_asks_for_one_cpu_by_default_and_exactly_what_the_options_say():
    assert runner_demand({}) == {"CPU": 1.0}
    assert runner_demand({"num_cpus": 0, "resources": {"rollout": 1}}) == {"rollout": 1.0}
    assert runner_demand({"num_cpus": 2, "num_gpus": 1, "memory": 2e9}) == {
        "CPU": 2.0, "GPU": 1.0, "memory": 2e9}


def test_custom_resources_keep_runners_off_the_head_and_the_trainer():
    fits = fit_nodes(NODES, FREE, runner_demand({"resources": {"rollout": 1}}), {})
    assert [f.node_id for f in fits] == ["head", "rollout-a", "rollout-b", "trainer"]  # alive
    assert [f.node_id for f in fits if f.can_host] == ["rollout-a", "rollout-b"]
    assert [f.node_id for f in fits if f.fits_now] == ["rollout-a"]


def test_labels_select_nodes_and_free_resources_decide_now():
    fits = fit_nodes(NODES, FREE, runner_demand({}), {"role": "rollout"})
    assert [f.node_id for f in fits if f.fits_now] == ["rollout-a", "rollout-b"]
    trainer = next(f for f in fits if f.node_id == "trainer")
    assert trainer.missing_labels == {"role": "trainer"}


def test_the_report_says_what_each_node_lacks():
    demand = runner_demand({"resources": {"rollout": 1}})
    fits = fit_nodes(NODES, FREE, demand, {"role": "rollout"})
    report = placement_report(fits, demand, {"role": "rollout"}, {"rollout-a": "npm not found"})
    assert "asks for CPU 1, rollout 1 on a node labelled role=rollout" in report
    assert "head (10.0.0.4): cannot host: no label role=rollout, no rollout" in report
    assert "rollout-b (10.0.0.9): busy: rollout 0 of 2 free" in report
    assert ("trainer (10.0.0.7): cannot host: label role=rollout (has 'trainer'), no rollout"
            in report)
    assert "its runner failed: npm not found" in report
    assert "no alive node" in placement_report([], demand, {})


def test_options_the_executor_owns_are_refused_by_name():
    with pytest.raises(ValueError, match="scheduling_strategy.*node_labels"):
        check_actor_options({"num_cpus": 1, "scheduling_strategy": "SPREAD"})
    with pytest.raises(ValueError, match="max_concurrency, name"):
        RayCluster(actor_options={"name": "x", "max_concurrency": 4})
    assert check_actor_options({"runtime_env": {"env_vars": {"A": "1"}}}) == {
        "runtime_env": {"env_vars": {"A": "1"}}}
