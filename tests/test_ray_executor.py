"""`executor="ray"`: the same Pi + oracle step on a local 2-CPU Ray cluster and on local threads.

One module-scoped pair of steps (threads, then Ray, same seed) backs the comparisons; the Ray
env's `close()` is checked to leave no actor, no process of the cluster it started and no
runner workspace behind. Then, on one running node (`ray start`) that each test connects to: a
runner that crashes mid-step, a runner that cannot start, two envs sharing one connection, a
connection the caller opened, the TRL path. A real multi-node cluster (nodes lost, frozen,
joining; two envs) is tests/test_ray_cluster.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest

import harness_gym  # noqa: F401  (registers HarnessSWE-v0)
from harness_gym.config import EpisodeConfig
from harness_gym.engines import load_engine
from harness_gym.engines.oracle import OracleEngine
from harness_gym.episode import EpisodeRequest
from harness_gym.scaleout.executors import make_executor
from harness_gym.integrations.trl import make_rollout_func
from harness_gym.scaleout.ray_cluster import RayCluster
from harness_gym.scaleout.ray_executor import ACTOR_NAMESPACE, RayEpisodeExecutor
from harness_gym.scaleout.ray_placement import RayPlacementError
from harness_gym.tasks.loader import load_tasks
from support.ray_cluster import one_node_cluster

ray = pytest.importorskip("ray", reason="executor='ray' needs Ray: pip install 'harness-gym[ray]'")
pytestmark = pytest.mark.skipif(shutil.which("npm") is None, reason="Pi installs with npm")

LOCAL_CLUSTER = {"num_cpus": 2, "resources": {"rollout": 1}, "include_dashboard": False,
                 "log_to_driver": False}
JOIN = {"log_to_driver": False}  # ray.init keywords joining `ray_address`: CLI logs stay there
ROLLOUT_SLOT = {"resources": {"rollout": 1}}  # each runner takes the cluster's one rollout slot
VERSIONS = np.array([3, 4])


def make_vec(**kwargs):
    settings = {"num_envs": 2, "group_size": 2, "harness": "pi", "engine": "oracle",
                "progress": False, **kwargs}
    return gym.make_vec("HarnessSWE-v0", vectorization_mode="vector_entry_point", **settings)


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` (from /proc; zombies count as gone)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pids: set[int]) -> set[int]:
    return pids & ({int(p.name) for p in Path("/proc").glob("[0-9]*")
                    if (p / "stat").exists() and _state(p) != "Z"})


def _state(proc: Path) -> str:
    try:
        return (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def one_step(envs):
    _, reset_infos = envs.reset(seed=0)
    started = time.perf_counter()
    _, rewards, _, _, infos = envs.step({"policy_version": VERSIONS})
    return {"reset_infos": reset_infos, "rewards": rewards, "infos": infos,
            "wall": time.perf_counter() - started}


def rollout_free_once_settled(timeout: float = 10.0) -> float:
    """The cluster's free `rollout` slots (Ray's accounting lags an actor's start a little)."""
    deadline = time.monotonic() + timeout
    while (free := ray.available_resources().get("rollout", 0.0)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return free


@pytest.fixture(scope="module")
def steps():
    assert not ray.is_initialized()
    local = make_vec()
    try:
        threads = one_step(local)
    finally:
        local.close()
    before = descendants(os.getpid())
    started = time.perf_counter()
    envs = make_vec(executor=RayCluster(init_kwargs=LOCAL_CLUSTER, actor_options=ROLLOUT_SLOT))
    try:
        envs.reset(seed=0)
        start_s = time.perf_counter() - started
        on_ray = one_step(envs)
        on_ray["rollout_free"] = rollout_free_once_settled()
        executor = envs.unwrapped._executor
        nodes = executor.nodes
        on_ray.update(start_s=start_s, nodes=nodes, actor_names=executor.actor_names,
                      processes=descendants(os.getpid()) - before | {nodes[0]["guard_pid"]},
                      placements=executor.placements)
    finally:
        envs.close()
    deadline = time.monotonic() + 30
    while alive(on_ray["processes"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    on_ray["left_alive"] = alive(on_ray["processes"])
    return {"threads": threads, "ray": on_ray}


@pytest.fixture(scope="module")
def ray_address():
    """A running node like `LOCAL_CLUSTER`, for the tests that are not about starting one."""
    with one_node_cluster(num_cpus=2, resources={"rollout": 1}) as cluster:
        yield cluster.address


def test_ray_runs_the_same_tasks_to_the_same_outcomes_and_rewards_as_threads(steps):
    threads, on_ray = steps["threads"]["infos"], steps["ray"]["infos"]
    assert on_ray["task_id"].tolist() == threads["task_id"].tolist()
    assert on_ray["next_task_id"].tolist() == threads["next_task_id"].tolist()
    assert on_ray["outcome"].tolist() == threads["outcome"].tolist() == ["passed", "passed"]
    np.testing.assert_array_equal(steps["ray"]["rewards"], steps["threads"]["rewards"])
    assert on_ray["policy_version_max"].tolist() == VERSIONS.tolist()


def test_ray_traces_have_the_shapes_of_the_thread_traces(steps):
    threads, on_ray = steps["threads"]["infos"], steps["ray"]["infos"]
    for local_trace, ray_trace in zip(threads["trace"], on_ray["trace"]):
        assert len(ray_trace) == len(local_trace) >= 1
        for local_segment, segment in zip(local_trace, ray_trace):
            assert segment.keys() == local_segment.keys()
            assert segment["role"] == local_segment["role"]
            n = len(segment["response_ids"])
            assert len(segment["loss_mask"]) == len(segment["response_logprobs"]) == n
            assert len(local_segment["loss_mask"]) == len(local_segment["response_ids"])
            # the oracle's answers are scripted: the same tokens (their logprobs differ a little,
            # as the prompts do: Pi's system prompt names the sandbox's own directory)
            assert segment["response_ids"] == local_segment["response_ids"]
            assert all(type(v) is int for v in segment["response_ids"])
            assert all(type(v) is float for v in segment["response_logprobs"])


def test_ray_infos_have_the_keys_and_dtypes_of_the_thread_infos(steps):
    threads, on_ray = steps["threads"]["infos"], steps["ray"]["infos"]
    assert on_ray.keys() == threads.keys()
    for key, value in threads.items():
        if isinstance(value, np.ndarray):
            assert on_ray[key].dtype == value.dtype, key


def test_the_local_cluster_runs_one_node_runner_with_its_own_proxy(steps):
    (node,) = steps["ray"]["nodes"]
    assert node["pid"] != os.getpid() and node["engine"] == "oracle"
    assert node["proxy_url"].startswith("http://127.0.0.1:") and node["harnesses"] == ["pi"]


def test_make_vecs_ray_actor_options_reach_the_runner_actor(steps):
    assert steps["ray"]["rollout_free"] == 0.0  # the runner holds the slot it was told to ask


def test_close_leaves_no_actor_process_or_workspace_of_the_cluster_behind(steps):
    on_ray = steps["ray"]
    assert on_ray["nodes"][0]["pid"] in on_ray["processes"]  # the actor was a process of ours
    assert on_ray["left_alive"] == set()  # the guard of its workspace included
    assert not Path(on_ray["nodes"][0]["workspace"]).exists()
    assert not ray.is_initialized()


def test_the_executor_logs_where_each_episode_ran(steps):
    (node,) = steps["ray"]["nodes"]
    placements = steps["ray"]["placements"]
    assert [p.outcome for p in placements] == ["passed", "passed"]
    assert all(p.nodes == (node["node_id"],) and p.called for p in placements)


def test_close_on_a_connection_the_caller_opened_kills_the_actors_and_leaves_ray_up(
        steps, ray_address):
    ray.init(address=ray_address, **JOIN)
    try:
        envs = make_vec(executor="ray")
        envs.reset(seed=0)
        (name,) = envs.unwrapped._executor.actor_names
        pid = envs.unwrapped._executor.nodes[0]["pid"]
        assert ray.get_actor(name, namespace=ACTOR_NAMESPACE)
        envs.close()
        assert ray.is_initialized()
        with pytest.raises(ValueError):
            ray.get_actor(name, namespace=ACTOR_NAMESPACE)
        deadline = time.monotonic() + 15
        while alive({pid}) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not alive({pid})
    finally:
        ray.shutdown()


def test_the_ray_executor_refuses_an_engine_object_and_an_unknown_executor():
    engine = OracleEngine(load_engine("tiny"))
    try:
        with pytest.raises(TypeError, match="spec string"):
            RayEpisodeExecutor(EpisodeConfig(engine=engine), max_episodes_per_node=1)
    finally:
        engine.close()
    with pytest.raises(ValueError, match="'threads', 'ray', a RayCluster"):
        make_vec(executor="processes")


@pytest.mark.parametrize("keyword, field", [("ray_address", "address"),
                                            ("ray_init", "init_kwargs"),
                                            ("ray_actor_options", "actor_options")])
def test_ray_settings_have_one_home_the_cluster_record(keyword, field):
    with pytest.raises(TypeError, match=rf"{keyword}: .*executor=RayCluster\({field}=\.\.\.\)"):
        make_vec(executor="ray", **{keyword: "auto"})


TRAINER = SimpleNamespace(  # what rollout_func reads of a GRPOTrainer
    model=None, num_generations=2, state=SimpleNamespace(global_step=7),
    args=SimpleNamespace(temperature=1.0, top_p=1.0, top_k=None, max_completion_length=4096))


def test_the_trl_rollout_func_runs_its_episodes_on_the_executor_it_is_given(ray_address):
    cluster = RayCluster(address=ray_address, init_kwargs=JOIN, poll_s=1.0)
    with make_rollout_func(harness="pi", engine="oracle", tasks="builtin",
                           executor=cluster) as rollout:
        assert rollout.executor is cluster
        task = rollout.tasks[0]
        out = rollout([task.instance_id] * 2, TRAINER)
        (envs,) = rollout._envs.values()
        assert isinstance(envs.unwrapped.executor, RayEpisodeExecutor)
    assert out["outcome"] == ["passed", "passed"] and out["policy_version"] == [7, 7]
    assert all(0 in mask and 1 in mask for mask in out["env_mask"])
    assert not ray.is_initialized()


def test_a_ray_rollout_row_without_an_agent_segment_gets_a_placeholder_from_a_local_engine():
    with make_rollout_func(harness="pi", engine="oracle", executor="ray") as rollout:
        task = rollout.tasks[0]
        infos = {"trace": [[]], "outcome": ["infra_error"], "n_tool_calls": [0]}
        rows = rollout._rows([task], np.array([0.0]), infos, engine=None)
    assert rows["env_mask"] == [[0]] and rows["policy_version"] == [None]
    assert len(rows["prompt_ids"][0]) > 10


def test_a_runner_never_starts_an_episode_sent_before_a_stop_and_runs_those_sent_after(tiny):
    """Ray runs an actor's calls on its threads in no fixed order, so an episode the executor
    sent just before `stop_running` can begin on its node after the node's stop: each is sent
    with the executor's stop count, and the runner treats one sent before a stop it has been
    told of as a thread executor treats a queued one. No Ray here: the runner's own rule."""
    from harness_gym.scaleout.node_runner import NodeRunner

    class CountsStarts(OracleEngine):
        started = 0

        def on_episode_start(self, task):
            super().on_episode_start(task)
            self.started += 1

    engine = CountsStarts(tiny)
    task = load_tasks("builtin")[0]
    runner = NodeRunner(EpisodeConfig.build(engine=engine, harness="pi", progress=False),
                        f"stops-{os.getpid()}")
    try:
        runner.stop_running(stops=1)
        early = runner.run(EpisodeRequest("pi", task), "sent-before", stops=0)
        assert early.outcome == "infra_error" and early.error.endswith("stopped before it started")
        assert engine.started == 0 and early.trace.n_llm_calls == 0
        late = runner.run(EpisodeRequest("pi", task), "sent-after", stops=1)
        assert late.outcome == "passed" and engine.started == 1
    finally:
        runner.close()


def test_the_trainers_in_process_model_cannot_serve_a_ray_executor():
    with pytest.raises(ValueError, match="engine='vllm:URL'"):
        make_rollout_func(harness="pi", executor="ray")


def test_a_runner_that_cannot_start_fails_start_up_with_its_reason(ray_address):
    config = EpisodeConfig(harness="pi", engine="hf:/no/such/model", progress=False)
    started = time.monotonic()
    with pytest.raises(RayPlacementError) as raised:
        RayEpisodeExecutor(config, max_episodes_per_node=1,
                           cluster=RayCluster(address=ray_address, init_kwargs=JOIN, poll_s=1.0))
    message = str(raised.value)
    assert "no Ray node runner could start:" in message  # at once, not at start_timeout_s
    assert "its runner failed: could not start:" in message and "/no/such/model" in message
    assert time.monotonic() - started < 240
    assert not ray.is_initialized()


def wait_for(predicate, what: str, timeout: float = 240.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise TimeoutError(f"waited {timeout:g} s for {what}")


@pytest.fixture(scope="module")
def crash(ray_address):
    """An env and, beside it, an executor built as an async rollout worker builds one (no
    vector env, requests submitted directly) share one node and one Ray connection. The
    env's runner is SIGKILLed mid-step (its process, not its node); the env steps again, then
    closes; the executor runs an episode after that, then closes."""
    env = make_vec(executor=RayCluster(address=ray_address, init_kwargs=JOIN, poll_s=1.0,
                                       retry_s=1.0))
    executor = None
    try:
        env.reset(seed=0)
        config = EpisodeConfig(harness="pi", engine="oracle", progress=False)
        executor = make_executor("ray", config, max_workers=1)  # joins the env's connection
        env_executor = env.unwrapped.executor
        (crashed,) = env_executor.nodes
        with ThreadPoolExecutor(1) as pool:
            step = pool.submit(env.step, None)
            wait_for(lambda: any(e.called for e in env_executor.in_flight()), "a model call")
            os.kill(crashed["pid"], signal.SIGKILL)
            _, _, _, _, infos = step.result(timeout=600)
        facts = {"crashed": crashed, "infos": infos, "placements": env_executor.placements[-2:],
                 "separate_runners": executor.actor_names != env_executor.actor_names}
        (facts["replaced"],) = wait_for(lambda: env_executor.nodes, "a new runner")
        _, _, _, _, facts["next_infos"] = env.step(None)
        env.close()
        facts["connected_after_env_closed"] = ray.is_initialized()
        request = EpisodeRequest("pi", load_tasks("builtin")[0], policy_version=5)
        facts["executor_result"] = executor.submit(request).result(timeout=600)
    finally:
        env.close()
        if executor is not None:
            executor.close()
    facts["connected_after_all_closed"] = ray.is_initialized()
    return facts


def test_a_crashed_runners_episodes_re_run_unless_they_had_made_a_model_call(crash):
    placements = crash["placements"]
    for placement in placements:
        if placement.called and len(placement.nodes) == 1:
            assert placement.outcome == "infra_error"  # it had spent policy tokens
        else:
            assert placement.outcome == "passed" and len(placement.nodes) == 2
    assert any(p.outcome == "infra_error" for p in placements)
    errors = [e for e in crash["infos"]["error"].tolist() if e]
    assert errors and all("after its first model call" in e for e in errors)


def test_a_crashed_runner_is_replaced_on_its_node_and_the_next_step_runs_there(crash):
    crashed, replaced = crash["crashed"], crash["replaced"]
    assert replaced["node_id"] == crashed["node_id"] and replaced["pid"] != crashed["pid"]
    assert crash["next_infos"]["outcome"].tolist() == ["passed", "passed"]


def test_a_crashed_runner_leaves_no_workspace_guard_or_process(crash):
    crashed = crash["crashed"]
    assert not Path(crashed["workspace"]).exists()
    assert not alive({crashed["pid"], crashed["guard_pid"]})


def test_envs_and_executors_in_one_process_share_one_connection_the_last_close_ends_it(crash):
    assert crash["separate_runners"]
    assert crash["connected_after_env_closed"]  # the executor still uses the env's connection
    result = crash["executor_result"]
    assert result.outcome == "passed" and result.info()["policy_version_max"] == 5
    assert not crash["connected_after_all_closed"]
