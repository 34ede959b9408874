"""A run that survives a restart (issue 24): `AsyncGRPOLoop` checkpoints and resumes to the
state the uninterrupted run has at the same step, honours the LR schedule across the restart,
and the rollout worker's `stop()` ends the episodes in flight at once instead of at their
timeout, leaving nothing behind.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("trl")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from support.async_samples import ReadySamples, args, generated_segment, tiny_model
from support.weights import weights_digest

from harness_gym.engines.scripted import ScriptedEngine
from harness_gym.integrations.async_grpo import (
    HarnessRolloutWorker,
    RolloutWorkerError,
    segment_samples,
)
from harness_gym.integrations.async_loop import AsyncGRPOLoop
from harness_gym.integrations.weight_transfer import EngineWeightTransfer


@pytest.fixture(scope="module")
def samples(tiny) -> list[Any]:
    """Two samples per step for 4 steps, each of the version the trainer is at when it takes
    them, and before step 4 one too stale to train (dropped, and counted)."""
    versions = [1, 1, 2, 2, 3, 3, 1, 4, 4]
    return [s for i, v in enumerate(versions) for s in segment_samples(
        [generated_segment(tiny, f"task {i}", version=v, temperature=0.8)],
        advantage=(-1.0) ** i, group_id=i, reward=0.0)]


def run(tiny, output_dir: Path, samples: list[Any], resume: bool = False
        ) -> tuple[AsyncGRPOLoop, ReadySamples, EngineWeightTransfer]:
    model = tiny_model()
    worker = ReadySamples(samples)
    transfer = EngineWeightTransfer.serving_copy(model, tiny.tokenizer)
    config = args(output_dir, max_steps=4, lr_scheduler_type="linear", save_strategy="steps",
                  save_steps=2)
    loop = AsyncGRPOLoop(model, config, worker, transfer)
    try:
        loop.train(resume_from_checkpoint=resume or None)
    finally:
        transfer.engine.close()
    return loop, worker, transfer


def optimizer_tensors(loop: AsyncGRPOLoop) -> list[torch.Tensor]:
    state = loop.optimizer.state_dict()["state"]
    return [t for i in sorted(state) for _, t in sorted(state[i].items())]


@pytest.fixture(scope="module")
def runs(tiny, samples, tmp_path_factory) -> dict[str, Any]:
    """The uninterrupted run; the same run killed during step 3 (its worker fails: no more
    samples); and that one resumed from its step-2 checkpoint by new objects, as a new process
    would."""
    root = tmp_path_factory.mktemp("resume")
    whole = run(tiny, root / "whole", samples)
    with pytest.raises(RolloutWorkerError):
        run(tiny, root / "crashed", samples[:5])
    after_crash = sorted(p.name for p in (root / "crashed").iterdir())
    resumed = run(tiny, root / "crashed", samples[4:], resume=True)
    return {"whole": whole, "resumed": resumed, "after_crash": after_crash,
            "dir": root / "crashed"}


def test_a_resumed_run_is_the_uninterrupted_run_at_the_same_step(runs):
    whole, whole_worker, whole_transfer = runs["whole"]
    resumed, resumed_worker, resumed_transfer = runs["resumed"]
    assert runs["after_crash"] == ["checkpoint-2"]  # and no half-written one beside it
    assert resumed.global_step == whole.global_step == 4
    assert weights_digest(resumed.model) == weights_digest(whole.model)
    ours, theirs = optimizer_tensors(resumed), optimizer_tensors(whole)
    assert len(ours) == len(theirs) > 0 and all(torch.equal(a, b) for a, b in zip(ours, theirs))
    assert resumed.scheduler.state_dict() == whole.scheduler.state_dict()
    assert resumed.model_version == whole.model_version == 5
    assert resumed_transfer.version == whole_transfer.version == 5
    assert resumed_transfer.engine.policy_version == whole_transfer.engine.policy_version == 5
    assert whole_worker.versions == [1, 2, 3, 4, 5] and resumed_worker.versions == [3, 4, 5]
    assert resumed.counts == whole.counts == {"samples_trained": 8, "dropped_stale": 1}
    assert [e["loss"] for e in resumed.log_history] == [e["loss"] for e in whole.log_history]
    assert sorted(p.name for p in runs["dir"].glob("checkpoint-*")) == [
        "checkpoint-2", "checkpoint-4"]


def test_the_lr_schedule_goes_on_across_a_resume(runs):
    resumed = runs["resumed"][0]
    # Linear decay from 1e-2 over 4 steps: the rate each step was taken at, steps 1-2 from the
    # checkpoint's log, 3-4 after the resume (a fresh schedule would restart at 1e-2).
    assert [e["learning_rate"] for e in resumed.log_history] == pytest.approx(
        [1e-2, 7.5e-3, 5e-3, 2.5e-3])
    assert resumed.optimizer.param_groups[0]["lr"] == pytest.approx(0.0)
    state = json.loads((runs["dir"] / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["global_step"] == 4 and state["model_version"] == 5


def test_resuming_without_a_checkpoint_says_so(tmp_path):
    loop = AsyncGRPOLoop(tiny_model(), args(tmp_path), ReadySamples([]), None)
    with pytest.raises(FileNotFoundError, match="no checkpoint-<step> under"):
        loop.train(resume_from_checkpoint=True)
    with pytest.raises(FileNotFoundError, match="is not a checkpoint"):
        loop.load_checkpoint(tmp_path)


def test_the_workers_task_draws_go_on_from_its_saved_state():
    first = HarnessRolloutWorker("builtin", harness="pi", engine="oracle", seed=3)
    first._rng.integers(100, size=7)  # groups started before the save
    first._next_group = 7
    state = json.loads(json.dumps(first.state_dict()))  # as the checkpoint stores it
    second = HarnessRolloutWorker("builtin", harness="pi", engine="oracle", seed=0)
    second.load_state_dict(state)
    assert second._next_group == 7
    assert second._rng.integers(100, size=5).tolist() == first._rng.integers(100, size=5).tolist()


# --- stop() -------------------------------------------------------------------------------


def _processes_with(marker: str) -> list[int]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker in cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                found.append(int(cmdline.parent.name))
        except OSError:
            pass
    return found


def _wait_while_running(worker: HarnessRolloutWorker, condition: Any, never: str) -> None:
    """Poll `condition()` until it holds, the worker staying healthy (at most 300 s)."""
    deadline = time.monotonic() + 300
    while not condition():
        worker.check_health(300)
        assert time.monotonic() < deadline, never
        time.sleep(0.2)


def _timed_stop(worker: HarnessRolloutWorker) -> float:
    """`worker.stop()`, and the seconds it took."""
    started = time.monotonic()
    worker.stop()
    return time.monotonic() - started


@pytest.mark.slow
def test_stop_ends_an_episode_hung_in_flight_at_once_as_an_infra_error(tiny, tmp_path,
                                                                      monkeypatch):
    if shutil.which("npm") is None:
        pytest.skip("Pi installs with npm")
    # Every temporary directory the episode makes (repos, sandbox) goes here, to count leaks.
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    marker = "sleep 613"  # the agent's command: runs until the 600 s episode timeout
    called = threading.Event()
    calls = itertools.count()

    def script(prompt_text: str) -> str:
        called.set()
        if next(calls):
            return "Done."
        call = {"name": "bash", "arguments": {"command": marker}}
        return f"Waiting.\n<tool_call>\n{json.dumps(call)}\n</tool_call>"

    engine = ScriptedEngine(tiny, script, model_name="tiny", tokenizer_source="tiny")
    worker = HarnessRolloutWorker(
        "builtin", group_size=1, groups_in_flight=1, harness="pi", engine=engine,
        sampling={"max_tokens": 64}, episode_timeout_s=600)
    worker.start()
    try:  # the episode is hung in its tool call
        _wait_while_running(worker, lambda: _processes_with(marker),
                            "the agent never ran its command")
    finally:
        stop_s = _timed_stop(worker)
    assert called.is_set()
    assert stop_s < 60, f"stop() took {stop_s:.0f}s"  # the episode's timeout is 600 s
    (stopped,) = [e for e in worker.events if e["kind"] == "group_stopped"]
    assert stopped["outcomes"] == ["infra_error"]
    assert worker.counts["episodes_stopped"] == 1 and worker.rollout_buffer.empty()
    # Nothing leaks: not the agent's process, not a temporary directory, not a thread.
    assert _processes_with(marker) == []
    assert list(temp.iterdir()) == []
    assert not [t for t in threading.enumerate() if t.name.startswith("harness-episode")]


@pytest.mark.slow
def test_stop_on_ray_ends_an_episode_held_mid_stream_at_once_as_an_infra_error(tiny):
    """The Ray twin: the worker's executor stops each node's running episodes (`stop_running`)
    instead of closing only after `stop_timeout_s`. The policy is the tiny model behind vLLM's
    wire protocol (`VLLMWireServer`, a fake of the wire only: a real server cannot be held
    mid-stream on cue), reached by the node's runner as a spec string; it holds Pi's stream
    after one token, so the episode would run to its 600 s timeout."""
    if shutil.which("npm") is None:
        pytest.skip("Pi installs with npm")
    ray = pytest.importorskip("ray", reason="executor='ray' needs Ray")
    from support.vllm_wire_server import VLLMWireServer

    from harness_gym.config import EpisodeConfig
    from harness_gym.scaleout.ray_cluster import RayCluster

    with VLLMWireServer(tiny, logprobs_mode="processed_logprobs") as server:
        server.hold(after_tokens=1)
        config = EpisodeConfig.build(
            harness="pi", engine=f"vllm:{server.url}?tokenizer=tiny", sampling={"max_tokens": 64},
            episode_timeout_s=600, progress=False)
        cluster = RayCluster(init_kwargs={
            "num_cpus": 2, "include_dashboard": False, "log_to_driver": False})
        worker = HarnessRolloutWorker("builtin", group_size=1, groups_in_flight=1,
                                      executor=cluster, config=config, stop_timeout_s=300)
        try:
            worker.start()
            # Pi's call reached the server, which holds its stream
            _wait_while_running(worker, lambda: server.calls, "Pi never called the model")
        finally:
            stop_s = _timed_stop(worker)
            server.release()
    assert stop_s < 60, f"stop() took {stop_s:.0f}s"  # before stop_running: stop_timeout_s
    (stopped,) = [e for e in worker.events if e["kind"] == "group_stopped"]
    assert stopped["outcomes"] == ["infra_error"]
    assert worker.counts["episodes_stopped"] == 1 and worker.rollout_buffer.empty()
    assert not ray.is_initialized()  # the executor it built is closed, its Ray shut down
