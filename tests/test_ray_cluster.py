"""The Ray executor on a real multi-node cluster: nodes die, freeze and join, envs share it, and
nothing leaks.

One driver program (`support/ray_cluster_story.py`, run as its own process, as a training driver
is) starts a cluster on this machine with `ray start` (a head without rollout resources, rollout
nodes with their own temp dirs, TMPDIRs, CPUs, `rollout` resources and labels; token auth), runs
two envs of Pi + oracle episodes on it through a sequence of events, and reports what it saw;
each test below asserts one property of that report. Only the machine is shared: a node is
"killed" or "frozen" by signalling its Ray processes (raylet, agents, workers), not the CLIs its
runners started, which is what makes the runners' cleanup visible.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from support.ray_cluster import kill_everything_under

pytest.importorskip("ray", reason="executor='ray' needs Ray: pip install 'harness-gym[ray]'")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("npm") is None, reason="Pi installs with npm"),
    pytest.mark.timeout(2400),  # the whole story runs in the first test's setup
]

TESTS = Path(__file__).parent


@pytest.fixture(scope="module")
def story():
    # A short root: Ray's unix sockets live under each node's temp dir (a 107-byte path limit).
    root = Path(tempfile.mkdtemp(prefix="hg-ray-"))
    try:
        done = subprocess.run(
            [sys.executable, "-m", "support.ray_cluster_story", str(root)], cwd=TESTS,
            capture_output=True, text=True, timeout=2200,
            env={**os.environ, "PYTHONPATH": str(TESTS)})
    finally:
        leaked = kill_everything_under(root)  # only if the story itself failed to clean up
        shutil.rmtree(root, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-4000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    facts["leaked_after_story"] = sorted(leaked)
    print("story:", json.dumps(facts))  # the timings, for `pytest -s`
    return facts


def chapter(story, name):
    assert "start" not in story["errors"], f"the cluster did not start:\n{story['errors']['start']}"
    error = story["errors"].get(name)
    assert error is None, f"chapter {name} failed:\n{error}"
    return story[name]


def outcomes_by_node(step):
    """node name -> outcomes of the episodes whose last try ran there."""
    found = {}
    for episode in step["episodes"]:
        found.setdefault(episode["nodes"][-1], []).append(episode["outcome"])
    return found


def test_runners_go_only_on_nodes_with_the_label_and_resources_asked_for(story):
    spread = chapter(story, "spread")
    assert spread["runner_nodes"] == ["a", "b"]  # not the head: no `rollout` resource or label
    assert spread["workspace_under_node_tmp"]


def test_a_step_spreads_its_episodes_over_the_nodes(story):
    spread = chapter(story, "spread")
    assert spread["outcomes"] == ["passed", "passed"]
    assert outcomes_by_node(spread) == {"a": ["passed"], "b": ["passed"]}


def test_a_second_env_shares_the_cluster_while_the_first_holds_its_runners(story):
    share = chapter(story, "share")
    assert share["runner_nodes"] == ["a", "b"]
    assert chapter(story, "freeze")["B"]["episodes"]  # and B ran episodes while A was open


def test_an_env_that_cannot_fit_fails_fast_saying_what_is_missing(story):
    share = chapter(story, "share")
    error = share["third_env_error"]
    assert share["third_env_s"] < 60
    assert "asks for CPU 1, rollout 1" in error
    assert error.count("busy: CPU 0 of 2 free, rollout 0 of 2 free") == 2  # a and b
    assert "cannot host: no rollout" in error  # the head


def test_a_node_killed_mid_step_fails_only_its_own_episodes(story):
    kill = chapter(story, "kill")
    assert outcomes_by_node(kill) == {"a": ["passed"], "b": ["infra_error"]}
    (error,) = kill["errors"]
    assert "lost with Ray node" in error and "after its first model call" in error


def test_a_killed_nodes_runners_leave_no_dirs_and_no_processes(story):
    for name, left in [("kill", "b_left"), ("freeze", "c_left")]:
        leftovers = chapter(story, name)[left]
        assert leftovers["dirs"] == [] and leftovers["pids"] == [], (name, leftovers)


def test_the_next_steps_use_only_live_nodes(story):
    live = chapter(story, "live_only")
    assert live["runner_nodes"] == ["a"]
    assert outcomes_by_node(live) == {"a": ["passed", "passed"]}


def test_a_node_that_joins_gets_a_runner_and_work(story):
    join = chapter(story, "join")
    assert join["runner_nodes"] == ["a", "c"]
    assert outcomes_by_node(join) == {"a": ["passed"], "c": ["passed"]}


def test_an_episode_lost_before_its_first_model_call_is_run_again_elsewhere(story):
    step = chapter(story, "freeze")["A"]
    assert step["outcomes"] == ["passed", "passed"]
    moved = [e for e in step["episodes"] if len(e["nodes"]) == 2]
    assert [(e["nodes"], e["outcome"]) for e in moved] == [(["c", "a"], "passed")]


def test_a_frozen_nodes_episodes_end_by_their_deadline_not_rays(story):
    step = chapter(story, "freeze")["B"]
    by_node = outcomes_by_node(step)
    assert by_node["c"] == ["infra_error"]
    assert "infra_error" not in by_node["a"]  # passed, or its own timeout on a loaded machine
    error = next(e for e in step["errors"] if "deadline" in e)
    assert f"within the episode deadline of {step['deadline_s']:g} s" in error
    assert "the node is silent" in error
    assert step["returned_after_freeze_s"] < step["deadline_s"] + 10
    assert step["c_alive_to_ray_at_return"]  # Ray had not noticed yet: the deadline ended it


def test_close_leaves_no_runner_guard_dir_or_process_on_any_node(story):
    close = chapter(story, "close")
    assert close["runners"] >= 6 and close["alive"] == []
    assert close["left"] == {name: {"dirs": [], "pids": [], "after_s": left["after_s"]}
                             for name, left in close["left"].items()}
    assert story["leaked_after_story"] == []


def test_a_driver_that_exits_without_close_leaves_no_dirs_behind(story):
    orphan = chapter(story, "orphan_driver")
    assert orphan["runner_nodes"] == ["head"]  # the rollout slots were all held
    assert orphan["left"]["dirs"] == [] and orphan["left"]["pids"] == []
    assert not any(Path(w).exists() for w in orphan["workspaces"])
