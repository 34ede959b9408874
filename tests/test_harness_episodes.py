"""Every registered harness CLI, for real, through our proxy: the oracle solves built-in tasks
with the CLI's own shell tool, the no-op oracle fails, and the episodes run in a network
namespace that has nothing but loopback (so no CLI can have looked anything up elsewhere).

Each harness runs in a child process under `unshare --net` (root only; without it the same
child runs on the host network and the offline assertion is skipped with the reason).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.parallel import each_in_threads, result_of, selected_params

from harness_gym.harness import available_harnesses, load_harness
from harness_gym.tasks.loader import load_tasks

BUILTIN = ("claude-code", "hermes", "opencode", "pi")
TASK_IDS = ("harness-gym__routes-61", "harness-gym__tabular-9")
TASKS = {t.instance_id: t for t in load_tasks("builtin")}

# The oracle's episodes, one per task, run at once through one vector env, and beside them (a
# thread) the no-op oracle's: three CLI episodes in about the time of one and a half on two
# cores, where one after the other they took three. Each env is reset (its engine loaded, its
# proxy started) on the main thread first: only the steps run side by side.
EPISODES = textwrap.dedent("""
    import json, sys
    from concurrent.futures import ThreadPoolExecutor
    import gymnasium as gym, numpy as np
    import harness_gym
    harness, task_ids = sys.argv[1], sys.argv[2].split(",")

    def one_info(infos, i):
        return {k: one_info(v, i) if isinstance(v, dict) else v[i]
                for k, v in infos.items() if not k.startswith("_") and infos["_" + k][i]}

    def step(engine, ids, envs):
        _, rewards, _, _, infos = envs.step({"policy_version": np.ones(len(ids), int)})
        return [{**one_info(infos, i), "reward": rewards[i], "engine": engine}
                for i in range(len(ids))]

    runs, out = [], []
    try:
        for engine, ids in (("oracle", task_ids), ("oracle:noop", task_ids[:1])):
            envs = gym.make_vec("HarnessSWE-v0", num_envs=len(ids), harness=harness,
                                engine=engine, vectorization_mode="vector_entry_point",
                                sandbox="local", episode_timeout_s=300, progress=False)
            runs.append((engine, ids, envs))
            envs.reset(options={"task_ids": ids})
        with ThreadPoolExecutor(len(runs)) as pool:
            for done in [pool.submit(step, *run) for run in runs]:
                out += done.result()
    finally:
        for _, _, envs in runs:
            envs.close()
    as_json = lambda v: v.item() if isinstance(v, np.generic) else v.tolist()
    print("RESULT " + json.dumps(out, default=as_json))
""")


def isolated_network() -> list[str] | None:
    """A command prefix that runs a child with only loopback, or None where that is not possible."""
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        return None
    probe = subprocess.run(["unshare", "--net", "true"], capture_output=True)
    return ["unshare", "--net", "--", "sh", "-c", 'ip link set lo up && exec "$@"', "sh"] \
        if probe.returncode == 0 else None


def run_episodes(harness: str) -> tuple[list[dict], bool]:
    prefix = isolated_network()
    command = [*(prefix or []), sys.executable, "-c", EPISODES, harness, ",".join(TASK_IDS)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1200)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):]), prefix is not None


def changed_lines(diff: str) -> list[str]:
    return sorted(line for line in diff.splitlines()
                  if line[:1] in "+-" and not line.startswith(("+++", "---")))


def test_the_four_builtin_harnesses_are_registered():
    assert set(BUILTIN) <= set(available_harnesses())


def installed_episodes(harness: str) -> tuple[list[dict], bool]:
    load_harness(harness).install()
    return run_episodes(harness)


@pytest.fixture(scope="module")
def builtin_episodes(request: pytest.FixtureRequest
                     ) -> dict[str, tuple[list[dict], bool] | Exception]:
    """harness -> its `run_episodes`, for the CLIs whose test below is selected, two drivers at
    a time (`support.parallel`: each driver its own process, network namespace, envs and
    sandboxes); a driver's error is raised by its CLI's test."""
    if shutil.which("npm") is None:
        pytest.skip("the CLIs install with npm")
    test = test_a_real_cli_solves_builtin_tasks_offline_with_the_oracle_and_fails_with_noop
    names = selected_params(request, test, "harness")
    return dict(zip(names, each_in_threads(installed_episodes, names, 2)))


@pytest.mark.slow
@pytest.mark.parametrize("harness", BUILTIN)
def test_a_real_cli_solves_builtin_tasks_offline_with_the_oracle_and_fails_with_noop(
        harness, builtin_episodes):
    infos, offline = result_of(builtin_episodes[harness])
    solved = [i for i in infos if i["engine"] == "oracle"]
    assert [i["task_id"] for i in solved] == list(TASK_IDS)
    for info in solved:
        task = TASKS[info["task_id"]]
        assert info["harness"] == harness
        assert info["outcome"] == "passed", (info["error"], info["harness_output"]["tail"][-2000:])
        assert all(info["tests"][t] == "PASSED" for t in task.FAIL_TO_PASS)  # tests really ran
        assert changed_lines(info["patch"]) == changed_lines(task.patch)
        assert info["n_tool_calls"] == 1  # the patch went through the CLI's own shell tool
        roles = [s["role"] for s in info["trace"]]
        assert roles.count("agent") == 1 and set(roles) <= {"agent", "auxiliary"}
        for segment in info["trace"]:
            assert len(segment["response_logprobs"]) == len(segment["response_ids"])
            sampled = [p for p, m in zip(segment["response_logprobs"], segment["loss_mask"]) if m]
            assert sampled and all(p < 0 for p in sampled)  # every sampled token has its p_old
    (failed,) = [i for i in infos if i["engine"] == "oracle:noop"]
    assert failed["outcome"] == "failed" and failed["reward"] == 0.0
    if not offline:
        pytest.skip("episodes passed, but on the host network: unshare --net needs root")


EXAMPLE_PLUGIN = Path(__file__).resolve().parent.parent / "examples" / "harness-gym-tiny-agent"


def test_a_third_party_plugin_installs_by_entry_point_and_solves_a_task(tmp_path: Path):
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--target", str(target), str(EXAMPLE_PLUGIN)],
        check=True, capture_output=True, timeout=300,
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    listed = subprocess.run([sys.executable, "-m", "harness_gym.cli", "harnesses"], env=env,
                            capture_output=True, text=True, timeout=120)
    assert any(line.startswith("tiny-agent ") for line in listed.stdout.splitlines()), listed
    done = subprocess.run([sys.executable, "-c", EPISODES, "tiny-agent", TASK_IDS[0]], env=env,
                          capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, done.stderr[-3000:]
    infos = json.loads(lines[-1][len("RESULT "):])
    assert [(i["engine"], i["outcome"], i["harness"]) for i in infos] == [
        ("oracle", "passed", "tiny-agent"), ("oracle:noop", "failed", "tiny-agent")]


@pytest.mark.slow
def test_one_vector_env_trains_one_policy_across_every_installed_cli():
    """Each sub-env runs its own CLI on the same task (a group that compares harnesses, so
    `mix_harnesses=True` says it explicitly), all through one proxy and one engine; every trace
    is labelled by the harness that made it."""
    import gymnasium as gym

    import harness_gym  # noqa: F401

    if shutil.which("npm") is None:
        pytest.skip("the CLIs install with npm")
    clis = sorted(name for name in available_harnesses() if load_harness(name).is_installed())
    assert set(BUILTIN) <= set(clis), "harness-gym harnesses --install"
    envs = gym.make_vec("HarnessSWE-v0", num_envs=len(clis), vectorization_mode="vector_entry_point",
                        group_size=len(clis), mix_harnesses=True, harness=clis, engine="oracle",
                        episode_timeout_s=600, progress=False)
    try:
        envs.reset(seed=0, options={"task_ids": [TASK_IDS[0]]})
        _, rewards, _, _, infos = envs.step(None)
        stack = envs.unwrapped._executor.stack
        assert len({id(runner.proxy) for runner in stack.runners.values()} | {id(stack.proxy)}) == 1
    finally:
        envs.close()
    assert list(infos["harness"]) == clis
    assert list(infos["outcome"]) == ["passed"] * len(clis), list(zip(clis, infos["error"]))
    assert all(reward > 0.5 for reward in rewards)  # every pass scores above the floor
    for harness, trace in zip(clis, infos["trace"]):
        roles = [s["role"] for s in trace]
        assert roles.count("agent") == 1, (harness, roles)
