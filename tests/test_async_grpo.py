"""Asynchronous GRPO: episodes keep running while the optimiser steps (issue 15).

The CPU path is `AsyncGRPOLoop` driving our `HarnessRolloutWorker` and `EngineWeightTransfer`
through TRL 1.16's two protocols, because `AsyncGRPOTrainer` itself cannot run here (the first
test pins where). The slow tests run the tiny model on real Pi episodes; the others use the tiny
engine directly (real generations, real weights). How the weights reach the engine (in process,
and vLLM at the wire) is `test_weight_transfer.py`.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import json
import math
import os
import queue
import shutil
import time
from typing import Any

import pytest
import torch

pytest.importorskip("trl")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from support.async_samples import (
    ReadySamples,
    args,
    generated_segment,
    tiny_model,
    two_call_segment,
)
from support.weights import weights_digest
from trl.experimental.async_grpo.async_grpo_trainer import (
    RolloutWorkerProtocol,
    WeightTransferProtocol,
)
from trl.experimental.async_grpo.packing import TreeRow

from harness_gym.engines import SamplingParams
from harness_gym.engines.scripted import ScriptedEngine
from harness_gym.engines.tiny import load_tiny_tokenizer, tiny_model_dir
from harness_gym.episode import EpisodeResult
from harness_gym.integrations.async_grpo import (
    HarnessRolloutWorker,
    segment_samples,
)
from harness_gym.integrations.async_loop import AsyncGRPOLoop, grpo_token_loss
from harness_gym.integrations.weight_transfer import EngineWeightTransfer, VLLMWeightTransfer


# --- why a loop of our own ----------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="the finding is about CPU-only torch")
def test_async_grpo_trainer_cannot_run_on_the_cpu_even_with_both_protocols(tiny, tmp_path):
    from datasets import Dataset
    from trl.experimental.async_grpo import AsyncGRPOTrainer, packing

    transfer = EngineWeightTransfer(tiny)
    worker = HarnessRolloutWorker("builtin", group_size=2, harness="pi", engine=tiny)
    with pytest.raises(AssertionError, match="Torch not compiled with CUDA") as failure:
        AsyncGRPOTrainer(model=str(tiny_model_dir()), args=args(tmp_path, token_budget=0),
                         processing_class=load_tiny_tokenizer(),
                         train_dataset=Dataset.from_dict({"prompt": ["x"] * 4}),
                         rollout_worker=worker, weight_transfer=transfer)
    names = [entry.name for entry in failure.traceback]
    assert "get_peak_flops_per_device" in names  # trl/trainer/utils.py:1824, from __init__
    # The second wall, met by every forward: the attention kernel is FlashAttention 3 from the Hub.
    assert packing.TREE_ATTENTION == "tree_fa3"
    if importlib_has("kernels"):
        pytest.skip("`kernels` is installed here; FA3 would still need CUDA and a download")
    with pytest.raises(ModuleNotFoundError, match="kernels"):
        packing._flash_attn()


def importlib_has(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def test_the_worker_and_the_transfers_have_trls_protocol_members():
    def members(protocol: type) -> dict[str, inspect.Signature]:
        return {name: inspect.signature(value) for name, value in vars(protocol).items()
                if callable(value) and not name.startswith("_")}

    worker_api = members(RolloutWorkerProtocol)
    assert set(worker_api) == {"start", "stop", "update_model_version", "check_health"}
    for name, signature in worker_api.items():
        ours = inspect.signature(getattr(HarnessRolloutWorker, name))
        assert list(ours.parameters) == list(signature.parameters), name
    worker = HarnessRolloutWorker("builtin", harness="pi", engine="oracle")
    assert isinstance(worker.rollout_buffer, queue.Queue)
    assert isinstance(worker.metrics_queue, queue.Queue)
    transfer_api = members(WeightTransferProtocol)
    for cls in (EngineWeightTransfer, VLLMWeightTransfer):
        for name, signature in transfer_api.items():
            ours = inspect.signature(getattr(cls, name))
            assert list(ours.parameters) == list(signature.parameters), (cls, name)


# --- samples ------------------------------------------------------------------------------


def test_a_segment_becomes_a_sample_that_trl_packs_into_its_own_tokens_and_p_old(tiny):
    segment = generated_segment(tiny, "pack me", version=3)
    segment["response_ids"] += [5, 6]  # a tool result the proxy inserted: outside the loss
    segment["loss_mask"] += [0, 0]
    segment["response_logprobs"] += [0.0, 0.0]
    (sample,) = segment_samples([segment], advantage=0.5, group_id=7, reward=1.0)
    assert sample.model_version == 3 and sample.group_id == 7 and sample.advantage == 0.5
    assert sample.input_ids.tolist() == segment["prompt_ids"] + segment["response_ids"]
    # What TRL's own packer makes of it: exactly the sampled tokens, with their p_old.
    row = TreeRow()
    row.add({"input_ids": torch.as_tensor(sample.input_ids),
             "completion_mask": torch.as_tensor(sample.completion_mask),
             "old_log_probs": torch.as_tensor(sample.old_log_probs),
             "advantage": sample.advantage, "group_id": sample.group_id})
    packed = row.pack()
    trained = packed["shift_labels"][packed["token_index"]].tolist()
    sampled = [t for t, m in zip(segment["response_ids"], segment["loss_mask"]) if m]
    assert trained == sampled
    expected = torch.tensor([p for p, m in zip(segment["response_logprobs"], segment["loss_mask"])
                             if m], dtype=torch.float32)
    assert torch.equal(packed["old_log_probs"], expected)


def test_only_agent_segments_with_sampled_tokens_are_trained_unless_auxiliary_is_asked_for(tiny):
    agent = generated_segment(tiny, "agent", version=1)
    auxiliary = dict(generated_segment(tiny, "title", version=1), role="auxiliary")
    discarded = dict(agent, role="discarded")
    untouched = dict(agent, loss_mask=[0] * len(agent["loss_mask"]))
    trace = [agent, auxiliary, discarded, untouched]
    assert len(segment_samples(trace, advantage=1.0, group_id=0, reward=1.0)) == 1
    both = segment_samples(trace, advantage=1.0, group_id=0, reward=1.0, train_auxiliary=True)
    assert [s.input_ids.tolist() for s in both] == [
        agent["prompt_ids"] + agent["response_ids"],
        auxiliary["prompt_ids"] + auxiliary["response_ids"]]


# --- re-scoring as sampled ----------------------------------------------------------------


def test_each_token_is_rescored_under_the_sampling_its_call_recorded(tiny, tmp_path):
    from trl.trainer.utils import selective_log_softmax

    segments = [
        generated_segment(tiny, "warm", version=1, max_tokens=12, temperature=0.7),
        generated_segment(tiny, "truncated", version=1, max_tokens=12, temperature=0.7,
                          top_p=0.9, top_k=20),
        two_call_segment(tiny, SamplingParams(max_tokens=8, temperature=0.7, seed=1),
                         SamplingParams(max_tokens=8, temperature=1.3, top_k=50, seed=2)),
    ]
    samples = [s for seg in segments
               for s in segment_samples([seg], advantage=1.0, group_id=0, reward=1.0)]
    assert samples[2].call_spans[1].temperature == 1.3 and samples[1].call_spans[0].top_k == 20
    model = tiny_model()
    transfer = EngineWeightTransfer.serving_copy(model, tiny.tokenizer)
    # The config's temperature is 1.0 (TRL's default); the samples were drawn at 0.7 and 1.3.
    config = args(tmp_path, max_steps=1, per_device_train_batch_size=len(samples))
    assert config.temperature == 1.0
    loop = AsyncGRPOLoop(model, config, ReadySamples(samples), transfer)
    try:
        loop.train()
    finally:
        transfer.engine.close()
    (first,) = loop.log_history
    # Step 1 trains the weights that sampled: every ratio is 1 (p_old re-scored exactly).
    assert abs(first["policy/ratio_max"] - 1) < 1e-4 and abs(first["policy/ratio_min"] - 1) < 1e-4
    # What the config's temperature would have made of the first sample: a biased ratio.
    ids = torch.as_tensor(samples[0].input_ids)[None]
    n = len(segments[0]["prompt_ids"])
    with torch.no_grad():
        logits = tiny_model()(input_ids=ids).logits[:, n - 1:-1]
    at_config_t = selective_log_softmax(logits.float(), ids[:, n:], config.temperature)
    old = torch.as_tensor(samples[0].old_log_probs[n:])
    assert float((at_config_t[0] - old).abs().max()) > 0.05


def test_a_sampled_token_whose_sampling_was_not_recorded_is_refused(tiny, tmp_path):
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

    from harness_gym.integrations.rescore import UnscorableSample

    unrecorded = dict(generated_segment(tiny, "no record", version=1),
                      sampling_temperature=[None])
    with pytest.raises(UnscorableSample, match="records no sampling"):
        segment_samples([unrecorded], advantage=1.0, group_id=0, reward=1.0)
    no_offsets = dict(generated_segment(tiny, "no offsets", version=1), call_starts=[None])
    with pytest.raises(UnscorableSample, match="call_starts"):
        segment_samples([no_offsets], advantage=1.0, group_id=0, reward=1.0)
    # A call that only inserted tokens (no sampled ones) needs no record.
    segment = two_call_segment(tiny, SamplingParams(max_tokens=6, temperature=0.7),
                               SamplingParams(max_tokens=6))
    segment["loss_mask"][segment["call_starts"][1]:] = [0] * (
        len(segment["loss_mask"]) - segment["call_starts"][1])
    segment["sampling_temperature"][1] = None
    (sample,) = segment_samples([segment], advantage=1.0, group_id=0, reward=1.0)
    assert len(sample.call_spans) == 1
    # A sample from elsewhere (TRL's own worker) carries no spans: the loop refuses it.
    (made,) = segment_samples([generated_segment(tiny, "plain", version=1)], advantage=1.0,
                              group_id=0, reward=1.0)
    plain = RolloutSample(**{f.name: getattr(made, f.name) for f in dataclasses.fields(RolloutSample)})
    model = tiny_model()
    transfer = EngineWeightTransfer.serving_copy(model, tiny.tokenizer)
    loop = AsyncGRPOLoop(model, args(tmp_path, max_steps=1, per_device_train_batch_size=1),
                         ReadySamples([plain]), transfer)
    try:
        with pytest.raises(UnscorableSample, match="no record of how its tokens were sampled"):
            loop.train()
    finally:
        transfer.engine.close()


# --- staleness ----------------------------------------------------------------------------


def staleness_run(tiny, tmp_path, stale: str) -> tuple[AsyncGRPOLoop, ReadySamples]:
    segments = [generated_segment(tiny, f"task {i}", version=v)
                for i, v in enumerate([1, 1, 0, 2, 2])]  # the 0 arrives when the trainer is at 2
    samples = [s for i, seg in enumerate(segments)
               for s in segment_samples([seg], advantage=(-1.0) ** i, group_id=i, reward=0.0)]
    model = tiny_model()
    worker = ReadySamples(samples)
    transfer = EngineWeightTransfer.serving_copy(model, tiny.tokenizer)
    loop = AsyncGRPOLoop(model, args(tmp_path, max_staleness=1), worker, transfer, stale=stale)
    try:
        loop.train()
    finally:
        transfer.engine.close()
    return loop, worker


def test_a_sample_older_than_max_staleness_is_dropped_and_counted(tiny, tmp_path):
    loop, worker = staleness_run(tiny, tmp_path, "drop")
    first, second = loop.log_history
    assert first["staleness/lag_0_total"] == 2 and "staleness/dropped_total" not in first
    assert second["staleness/lag_2_total"] == 1 and second["staleness/dropped_total"] == 1
    assert second["staleness/lag_0_total"] == 2  # the step went on with the two fresh ones
    assert worker.rollout_buffer.empty() and worker.versions == [1, 2, 3]


def test_a_stale_sample_kept_with_importance_weights_is_trained_and_counted(tiny, tmp_path):
    loop, worker = staleness_run(tiny, tmp_path, "weight")
    second = loop.log_history[1]
    assert second["staleness/weighted_total"] == 1 and "staleness/dropped_total" not in second
    assert second["staleness/lag_2_total"] == 1 and second["staleness/lag_0_total"] == 1
    assert worker.rollout_buffer.qsize() == 1  # the batch was full with the stale one in it


def test_importance_weights_keep_the_gradient_where_ppo_clipping_zeroes_it():
    logps = torch.log(torch.tensor([[0.9]])).requires_grad_()
    old = torch.log(torch.tensor([[0.3]]))  # ratio 3: far outside the clip range
    advantage = torch.tensor([[1.0]])
    grads = []
    for weighted in (False, True):
        logps.grad = None
        grpo_token_loss(logps, old, advantage, torch.tensor([[weighted]]), epsilon=0.2,
                        epsilon_high=None, importance_clip_max=2.0).sum().backward()
        grads.append(float(logps.grad))
    assert grads[0] == 0.0  # clipped: a stale sample would teach nothing
    assert grads[1] == pytest.approx(-2.0)  # weighted by min(3, C=2)


# --- the whole thing on real Pi episodes --------------------------------------------------


class RecordingTransfer(EngineWeightTransfer):
    """Keeps a digest of the engine's weights at every version."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.digests: dict[int, str] = {}

    def send_weights(self, iterator) -> None:
        super().send_weights(iterator)
        self.digests[self.version] = weights_digest(self.engine.model)


def alternating_rewards(results: list[EpisodeResult]) -> list[float]:
    """1, 0, ...: the tiny model's episodes all fail alike; this gives each group a spread,
    hence nonzero advantages and a real gradient (as tests/test_trl_integration.py does)."""
    return [float(i % 2 == 0) for i in range(len(results))]


@pytest.fixture(scope="module")
def pi_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if shutil.which("npm") is None:
        pytest.skip("Pi installs with npm")
    model = tiny_model()
    tokenizer = load_tiny_tokenizer()
    served = RecordingTransfer(EngineWeightTransfer.serving_copy(
        model, tokenizer, model_name="tiny", tokenizer_source="tiny").engine)
    worker = HarnessRolloutWorker(
        "builtin", group_size=2, groups_in_flight=2, harness="pi", engine=served.engine,
        sampling={"max_tokens": 32, "temperature": 0.7}, episode_timeout_s=180,
        reward_fn=alternating_rewards)
    loop = AsyncGRPOLoop(model, args(tmp_path_factory.mktemp("async"), max_steps=3), worker,
                         served)
    started = time.monotonic()
    try:
        loop.train()
    finally:
        served.engine.close()
    return {"loop": loop, "worker": worker, "transfer": served,
            "wall_s": time.monotonic() - started}


@pytest.mark.slow
def test_three_optimiser_steps_on_pi_episodes_produced_while_training(pi_run):
    loop, worker = pi_run["loop"], pi_run["worker"]
    assert loop.global_step == 3 and len(loop.log_history) == 3
    assert all(math.isfinite(entry["loss"]) for entry in loop.log_history)
    ends = [e for e in worker.events if e["kind"] == "group_end"]
    assert ends and all(set(e["outcomes"]) <= {"failed", "harness_error", "timeout"} for e in ends)
    assert worker.counts["samples"] >= 6


@pytest.mark.slow
def test_episodes_of_version_v_plus_1_start_before_step_v_plus_1_ends(pi_run):
    loop, worker = pi_run["loop"], pi_run["worker"]
    step_end = {e["step"]: e["time"] for e in loop.events if e["kind"] == "step_end"}
    computing = {e["step"]: e["time"] for e in loop.events if e["kind"] == "step_compute"}
    overlapping = [(e["version"], e["time"]) for e in worker.events if e["kind"] == "group_start"
                   and e["version"] >= 2 and e["time"] < step_end[e["version"]]]
    assert overlapping, (loop.events, worker.events)
    # What a synchronous trainer never does: episodes run while the optimiser computes a step
    # (from the moment its samples are in to its end).
    ended = {e["group"]: e["time"] for e in worker.events if e["kind"] == "group_end"}
    in_flight_during_a_step = [
        (step, e["group"]) for e in worker.events if e["kind"] == "group_start"
        for step in step_end if step >= 2
        and e["time"] < step_end[step] and ended.get(e["group"], float("inf")) > computing[step]]
    assert in_flight_during_a_step, (loop.events, worker.events)


@pytest.mark.slow
def test_the_served_weights_change_at_every_version(pi_run):
    digests = pi_run["transfer"].digests
    assert sorted(digests) == [1, 2, 3, 4]  # the first sync, then one per step
    assert len(set(digests.values())) == 4


@pytest.mark.slow
def test_fresh_samples_p_old_is_the_trainers_own_rescore(pi_run):
    # Version 1: the engine's copy is the trainer's model; sampled at 0.7, the config says 1.0.
    first = pi_run["loop"].log_history[0]
    assert first["staleness/lag_0_total"] == 2
    assert abs(first["policy/ratio_max"] - 1) < 1e-4 and abs(first["policy/ratio_min"] - 1) < 1e-4


@pytest.mark.slow
def test_the_log_has_throughput_idle_fraction_queue_staleness_reward_and_pass_rate(pi_run):
    merged: dict[str, Any] = {}
    for entry in pi_run["loop"].log_history:
        merged.update(entry)
    for key in ("rollout/episodes_per_s", "perf/optimizer_idle_frac", "rollout/queue_depth",
                "rollout/reward_mean", "rollout/pass_rate", "staleness/lag_0_total"):
        assert key in merged, key
    assert 0 <= merged["perf/optimizer_idle_frac"] <= 1 and merged["rollout/episodes_per_s"] > 0


@pytest.mark.slow
def test_a_truncated_pi_episode_yields_one_sample_per_segment_token_for_token(tiny):
    if shutil.which("npm") is None:
        pytest.skip("Pi installs with npm")

    calls = itertools.count()

    def script(prompt_text: str) -> str:  # long tool results until the context overflows
        done = next(calls)  # counted here: a truncated prompt no longer shows them all
        if done >= 6:
            return "All done."
        call = {"name": "bash", "arguments": {"command": "seq 1 500"}}
        return f"Listing {done}.\n<tool_call>\n{json.dumps(call)}\n</tool_call>"

    engine = ScriptedEngine(tiny, script, model_name="tiny", tokenizer_source="tiny")
    # Pi's own floor (its spec's min_context); its first prompt is ~2.1k tiny tokens, each
    # listing ~2.5k, so six of them overflow it.
    engine.max_context = 8192
    groups: list[tuple[list[EpisodeResult], list[Any]]] = []
    worker = HarnessRolloutWorker(
        "builtin", group_size=1, groups_in_flight=1, harness="pi", engine=engine,
        context_overflow="truncate", sampling={"max_tokens": 64}, episode_timeout_s=180,
        train_auxiliary=True, on_group=lambda results, samples: groups.append((results, samples)))
    worker.start()
    try:
        deadline = time.monotonic() + 400
        while not groups:
            worker.check_health(300)
            assert time.monotonic() < deadline
            time.sleep(0.5)
    finally:
        worker.stop()
    (result,), samples = groups[0]
    assert result.n_truncations >= 1
    trainable = [s for s in result.trace.to_dicts()
                 if s["role"] in ("agent", "auxiliary") and any(s["loss_mask"])]
    assert sum(s["role"] == "agent" for s in trainable) >= 2 and len(samples) == len(trainable)
    for sample, segment in zip(samples, trainable):
        n = len(segment["prompt_ids"])
        assert sample.input_ids.tolist() == segment["prompt_ids"] + segment["response_ids"]
        assert sample.completion_mask.tolist() == [0] * n + segment["loss_mask"]
        assert sample.old_log_probs.tolist() == pytest.approx(
            [0.0] * n + segment["response_logprobs"], abs=1e-6)  # float32 of the trace's floats
        assert sample.model_version == segment["policy_version"]
        assert sample.group_id == samples[0].group_id and sample.advantage == samples[0].advantage
    assert dataclasses.fields(samples[0])  # a TRL RolloutSample


@pytest.mark.slow
def test_the_worker_runs_its_groups_on_the_ray_executor():
    if shutil.which("npm") is None:
        pytest.skip("Pi installs with npm")
    ray = pytest.importorskip("ray", reason="executor='ray' needs Ray")
    from harness_gym.config import EpisodeConfig
    from harness_gym.scaleout.ray_cluster import RayCluster

    # Ray ships the engine as a spec string (an in-process engine cannot follow its weights to
    # the actors: on a cluster that is `vllm:URL`); the oracle passes, so every episode counts.
    # The worker starts the executor from the factory, and closes it at stop(). One group only:
    # a second one would be stopped mid-run (test_async_resume has stop() on Ray).
    config = EpisodeConfig.build(harness="pi", engine="oracle", progress=False)
    cluster = RayCluster(init_kwargs={
        "num_cpus": 2, "include_dashboard": False, "log_to_driver": False})
    groups: list[tuple[list[EpisodeResult], list[Any]]] = []
    worker = HarnessRolloutWorker(
        "builtin", group_size=2, groups_in_flight=1, executor=cluster, config=config,
        max_groups_per_version=1,
        on_group=lambda results, samples: groups.append((results, samples)))
    try:
        worker.start()
        first = worker.rollout_buffer.get(timeout=300)
        worker.check_health(300)
        executor = worker._executor
    finally:
        worker.stop()
    # stop() closed the executor it built: no runner left, and the Ray it started is shut down.
    assert executor.nodes == [] and not ray.is_initialized()
    results, samples = groups[0]
    assert [r.outcome for r in results] == ["passed", "passed"]
    assert first is samples[0] and {s.group_id for s in samples} == {0}
    assert [s.advantage for s in samples] == [0.0] * len(samples)  # equal rewards, no signal
    segments = [seg for r in results for seg in r.trace.to_dicts()
                if seg["role"] == "agent" and any(seg["loss_mask"])]
    assert [s.input_ids.tolist() for s in samples] == [
        seg["prompt_ids"] + seg["response_ids"] for seg in segments]
    metrics = worker.metrics_queue.get_nowait()
    assert metrics["rollout/pass_rate"] == (2.0, 2.0)


@pytest.mark.slow
def test_a_capped_worker_starts_no_more_groups_until_the_trainer_moves_on():
    if shutil.which("npm") is None:
        pytest.skip("Pi installs with npm")
    worker = HarnessRolloutWorker("builtin", group_size=1, groups_in_flight=3, harness="pi",
                                  engine="oracle:noop", max_groups_per_version=1)
    worker.update_model_version(1)
    worker.start()
    try:
        first = worker.rollout_buffer.get(timeout=120)
        time.sleep(2.0)  # room for a second group, were the cap not honoured
        assert [e["version"] for e in worker.events if e["kind"] == "group_start"] == [1]
        worker.update_model_version(2)  # the trainer stepped: one more group, on version 2
        worker.rollout_buffer.get(timeout=120)
        worker.check_health(120)
    finally:
        worker.stop()
    starts = [e["version"] for e in worker.events if e["kind"] == "group_start"]
    assert starts == [1, 2] and first.group_id == 0
