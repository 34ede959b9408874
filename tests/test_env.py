"""`HarnessSWE-v0` end to end: the real Pi CLI, a real proxy, real git repos and pytest runs.

Policies: `oracle` (applies the gold patch through Pi's own bash tool), `oracle:noop`, `tiny`
(random weights: gibberish), and scripted ones built on tiny for misbehaving agents.
"""

from __future__ import annotations

import glob
import json
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import harness_gym  # noqa: F401  (registers HarnessSWE-v0)
from harness_gym.engines.agent_tools import AgentTools, tool_call_text
from harness_gym.engines.oracle import OracleEngine
from harness_gym.engines.scripted import ScriptedEngine
from harness_gym.harness import Endpoint, HarnessOutput, HarnessSpec, LaunchPlan, Package
from harness_gym.rewards import RewardConfig
from harness_gym.tasks.diffs import paths_touched_by
from harness_gym.tasks.loader import load_tasks
from support.engines import RecordingEngine
from support.parallel import in_threads

pytestmark = pytest.mark.skipif(shutil.which("npm") is None, reason="Pi installs with npm")

TASKS = load_tasks("builtin")


def changed_lines(diff: str) -> list[str]:
    return sorted(
        line for line in diff.splitlines()
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    )


def sampled(segment: dict) -> tuple[list[int], list[float]]:
    keep = [i for i, m in enumerate(segment["loss_mask"]) if m]
    return ([segment["response_ids"][i] for i in keep],
            [segment["response_logprobs"][i] for i in keep])


def test_pi_with_the_oracle_solves_every_builtin_task(tiny):
    """Three envs at once (`support.parallel`), each with its own recording oracle over the one
    tiny scorer, so each episode's sampled tokens are checked against its own engine's calls."""
    reward = RewardConfig(tool_penalty=0.02)

    def solve(share):
        oracle = OracleEngine(tiny)
        oracle.add_tasks(TASKS)
        engine = RecordingEngine(oracle)
        env = gym.make("HarnessSWE-v0", harness="pi", engine=engine, reward=reward)
        try:
            for task in share:
                calls_before = len(engine.calls)
                problem, info = env.reset(options={"task_id": task.instance_id})
                assert problem == task.problem_statement and info["task_id"] == task.instance_id
                _, reward_value, terminated, truncated, info = env.step({"policy_version": 4})
                assert (terminated, truncated) == (True, False)
                assert info["outcome"] == "passed", (task.instance_id, info["error"], info["grade"])
                assert info["n_tool_calls"] == 1 and info["n_llm_calls"] == 2
                assert reward_value == pytest.approx(1.0 - 0.02 * info["n_tool_calls"])
                assert info["reward_breakdown"]["outcome"] == "passed"
                assert all(info["tests"][t] == "PASSED" for t in task.FAIL_TO_PASS)
                assert changed_lines(info["patch"]) == changed_lines(task.patch)
                (segment,) = info["trace"]
                assert segment["role"] == "agent" and segment["policy_version"] == 4
                ids, logprobs = sampled(segment)
                mine = engine.calls[calls_before:]
                assert ids == [t for c in mine for t in c["token_ids"]]
                assert logprobs == [p for c in mine for p in c["logprobs"]]
                assert info["policy_version_min"] == info["policy_version_max"] == 4
        finally:
            env.close()
        return [task.instance_id for task in share]

    assert in_threads(solve, TASKS, workers=3) == [t.instance_id for t in TASKS]


def test_the_noop_oracle_fails_with_the_failure_value(tiny):
    noop = OracleEngine(tiny, noop=True)
    env = gym.make("HarnessSWE-v0", harness="pi", engine=noop,
                   reward={"failure": -0.25, "pass_floor": 0.5})
    try:
        env.reset(seed=3)
        _, reward_value, _, _, info = env.step(None)
    finally:
        env.close()
    assert info["outcome"] == "failed" and reward_value == -0.25
    assert info["patch"] == "" and info["n_tool_calls"] == 0
    assert any(status == "FAILED" for status in info["tests"].values())


def test_a_gibberish_policy_ends_cleanly_in_failed_or_harness_error(tiny):
    env = gym.make("HarnessSWE-v0", harness="pi", engine=tiny, episode_timeout_s=120,
                   sampling={"max_tokens": 48})
    try:
        env.reset(seed=1)
        _, reward_value, _, _, info = env.step({"temperature": 1.0})
    finally:
        env.close()
    assert info["outcome"] in ("failed", "harness_error"), info["error"]
    assert reward_value == 0.0 and info["n_llm_calls"] >= 1
    assert info["trace"] and all(len(s["response_logprobs"]) == len(s["response_ids"])
                                 for s in info["trace"])


def test_an_agent_that_rewrites_the_failing_tests_still_fails(tiny):
    task = TASKS[0]
    test_file = next(p for p in paths_touched_by(task.test_patch) if p.endswith(".py"))

    def cheat(prompt: str) -> str:
        if "<tool_response>" in prompt:
            return "Tests pass now."
        command = f"printf 'def test_fine():\\n    assert True\\n' > {test_file}"
        return ('<tool_call>\n' + json.dumps({"name": "bash", "arguments": {"command": command}})
                + '\n</tool_call>')

    env = gym.make("HarnessSWE-v0", harness="pi", engine=ScriptedEngine(tiny, cheat))
    try:
        env.reset(options={"task_id": task.instance_id})
        _, reward_value, _, _, info = env.step(None)
    finally:
        env.close()
    assert test_file in info["patch"]  # the agent did rewrite it...
    assert info["outcome"] == "failed" and reward_value == 0.0  # ...and the grader reset it
    assert all(info["tests"].get(t) != "PASSED" for t in task.FAIL_TO_PASS)


class LoopsAfterFixing(OracleEngine):
    """The oracle's fix (`fix=True`) or nothing, then `ls` through the shell tool forever: a
    policy that never ends its episode."""

    def __init__(self, scorer, *, fix: bool) -> None:
        super().__init__(scorer)
        self.fix = fix

    def _answer(self, prompt: str) -> str:
        if self.fix and "<tool_response>" not in prompt:
            return super()._answer(prompt)
        return "Let me look again.\n" + tool_call_text(
            AgentTools.from_prompt(prompt).shell_call("ls"))


@pytest.mark.parametrize("fix", [True, False], ids=["fixed-then-loops", "only-loops"])
def test_max_model_calls_stops_a_looping_policy_and_grades_what_it_left(tiny, fix):
    task = TASKS[0]
    env = gym.make("HarnessSWE-v0", harness="pi", engine=LoopsAfterFixing(tiny, fix=fix),
                   max_model_calls=3, episode_timeout_s=300)
    try:
        env.reset(options={"task_id": task.instance_id})
        _, reward_value, terminated, truncated, info = env.step(None)
    finally:
        env.close()
    assert info["call_limit_reached"] and (terminated, truncated) == (True, False)
    assert info["n_llm_calls"] == 3 and info["n_tool_calls"] == 3  # no 4th call was sampled
    assert info["duration_s"] < 120  # stopped at once, not at the 300 s timeout
    if fix:  # graded as it stood: the fix made in its first call passes
        assert info["outcome"] == "passed" and reward_value > 0.9
        assert all(info["tests"][t] == "PASSED" for t in task.FAIL_TO_PASS)
    else:  # stopped by us, so a plain failure, not a harness error
        assert info["outcome"] == "failed" and reward_value == 0.0 and info["patch"] == ""


SLEEP = f"1000.{uuid.uuid4().int % 10**9:09d}"  # a duration no other run on this machine uses


class NeverExits(HarnessSpec):
    """A harness that hangs, leaving a child and a setsid grandchild behind."""

    name = "never-exits"
    package = Package("npm", "never-exits-test-only", "0.0.0", bin="never")
    dialect = "openai-chat"
    shell_tool = "bash"

    def install(self, cache_dir=None, progress=None):
        return Path(tempfile.gettempdir())

    def prepare(self, sandbox, endpoint: Endpoint, prompt: str, cache_dir=None) -> LaunchPlan:
        script = f"sleep {SLEEP} & setsid sleep {SLEEP} & sleep {SLEEP}"
        return LaunchPlan(argv=["bash", "-c", script])

    def args(self, endpoint, prompt):
        return []

    def parse_output(self, stdout: str) -> HarnessOutput:
        return HarnessOutput(None, None, stdout[-200:])


def sleepers() -> set[int]:
    found = set()
    for cmdline in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            if Path(cmdline).read_bytes() == f"sleep\x00{SLEEP}\x00".encode():
                found.add(int(cmdline.split("/")[2]))
        except OSError:
            pass
    return found


def test_a_harness_that_never_exits_is_killed_at_the_timeout_and_nothing_survives(
    tiny, tmp_path, monkeypatch
):
    # Everything the episode creates in the temp dir lands in a private one, so the census
    # counts this test's leftovers only.
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private_tmp))
    monkeypatch.setenv("TMPDIR", str(private_tmp))
    sleepers_before = sleepers()
    env = gym.make("HarnessSWE-v0", harness=NeverExits(), engine=tiny, episode_timeout_s=1.5)
    try:
        env.reset(seed=0)
        _, reward_value, terminated, truncated, info = env.step(None)
        assert info["outcome"] == "timeout" and reward_value == 0.0
        assert "episode_timeout_s" in info["error"]
        assert (terminated, truncated) == (True, False)
        assert sleepers() == sleepers_before  # the child and the setsid escapee are gone
        assert any(private_tmp.iterdir())  # the env does keep its files there (repos)
    finally:
        env.close()
    assert sleepers() == sleepers_before
    assert list(private_tmp.iterdir()) == []


def test_gymnasium_check_env_passes(tiny):
    oracle = OracleEngine(tiny)
    env = gym.make("HarnessSWE-v0", harness="pi", engine=oracle, tasks=TASKS[:2])
    try:
        check_env(env.unwrapped, skip_render_check=True)
    finally:
        env.close()


def test_make_by_module_path_works_without_importing_the_package():
    code = ("import gymnasium as gym; "
            "env = gym.make('harness_gym:HarnessSWE-v0', engine='oracle:noop'); "
            "print(type(env.unwrapped).__name__, env.observation_space.contains('é ✓')); env.close()")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["HarnessSWEEnv", "True"], out.stderr[-2000:]


def test_bad_arguments_get_clear_errors():
    with pytest.raises(ValueError, match="episode_timeout_s"):
        gym.make("HarnessSWE-v0", episode_timeout_s=0)
    for calls in (0, 2.5, True, "3"):
        with pytest.raises(ValueError, match=f"max_model_calls must be .* got {calls!r}"):
            gym.make("HarnessSWE-v0", max_model_calls=calls)
    with pytest.raises(Exception, match="unknown harness 'nope'"):
        gym.make("HarnessSWE-v0", harness="nope")
    env = gym.make("HarnessSWE-v0", engine="oracle:noop")
    try:
        with pytest.raises(gym.error.ResetNeeded):
            env.step(None)
        with pytest.raises(ValueError, match="no task 'missing'"):
            env.reset(options={"task_id": "missing"})
    finally:
        env.close()
