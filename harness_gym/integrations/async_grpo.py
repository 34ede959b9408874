"""Asynchronous GRPO on harness episodes: a rollout worker that never waits for the optimiser.

`HarnessRolloutWorker` implements TRL 1.16's `RolloutWorkerProtocol`
(`trl/experimental/async_grpo/async_grpo_trainer.py`): it runs harness episodes continuously,
`groups_in_flight` GRPO groups at a time on an `EpisodeExecutor` (local threads or Ray), and as
each group ends it computes the group-relative advantages from the real rewards and pushes one
TRL `RolloutSample` per trainable trace segment onto `rollout_buffer`, tagged with the oldest
policy version that served it. Measurements go to `metrics_queue`. The trainer consumes samples
at its own pace and tells the worker each new version (`update_model_version`).

Every segment is trained: a CLI that rewrote its history (compaction, context truncation, a
sub-agent) leaves several agent segments, each its own token sequence; each becomes one sample,
all carrying the episode's advantage and group (TRL's own worker stamps one advantage on every
row of a conversation in the same way). `auxiliary` segments (a title generator, a summariser)
are trained with `train_auxiliary=True`. The synchronous `rollout_func`
(`integrations/trl.py`) keeps one row per prompt, as `GRPOTrainer` requires.

Episodes are not stopped by a weight update (partial rollouts): each model call records the
version of the weights that served it (`policy_versions` per segment), so a sample's
`model_version` is its oldest, and the trainer's staleness rule applies to that.

Who consumes the samples (`harness_gym.integrations.async_loop` has the details):
`AsyncGRPOTrainer(rollout_worker=worker, weight_transfer=...)` on a CUDA machine, or, on the
CPU, where that trainer cannot run, `AsyncGRPOLoop`, which drives the same two protocols.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..config import EpisodeConfig
from ..episode import EpisodeRequest, EpisodeResult
from ..scaleout.executors import EpisodeExecutor, ExecutorFactory, ExecutorSpec, make_executor
from ..scaleout.ray_cluster import RayCluster
from ..tasks.loader import TaskSpec, load_tasks
from ..tasks.task import Task
from ..wrappers import group_advantages
from .rescore import CallSpan, call_spans

log = logging.getLogger(__name__)

__all__ = ["HarnessRolloutWorker", "RolloutWorkerError", "segment_samples"]

#: Roles whose segments become samples (with `train_auxiliary`, the second too).
TRAINED_ROLES = ("agent", "auxiliary")


class RolloutWorkerError(RuntimeError):
    """The rollout worker stopped producing (its thread failed, or it hung)."""


@dataclass
class _Group:
    group_id: int
    task: Task
    version: int  # the trainer's version when the group started
    futures: list[Future[EpisodeResult]] = field(default_factory=list)


class HarnessRolloutWorker:
    """TRL's `RolloutWorkerProtocol` over harness episodes (see the module docstring).

    `executor` is an `EpisodeExecutor` (the caller's; not closed here), a name ("threads",
    "ray") or a factory (`RayCluster(...)`), built from `config` at `start()` with room for
    every episode in flight and closed at `stop()`. Ray ships
    the engine to its actors as a spec string, so there the weights reach the episodes through
    a `vllm:` engine and `VLLMWeightTransfer`; `EngineWeightTransfer` updates an in-process
    engine, which only the thread executor serves from.
    `reward_fn(results)` may replace a group's rewards (default: each episode's test-gated
    reward). `on_group(results, samples)` sees each finished group before its samples are
    queued (to record traces, say). `max_groups_per_version` caps the groups started while the
    trainer is at one version (None: no cap; a group that yields fewer samples than episodes
    gives its slot back, so the step still gets its samples); `per_device_train_batch_size // group_size` makes
    the synchronous schedule (each step's rollouts start after the previous step, on its
    weights), the control `benchmarks/async_vs_sync.py` runs on the same loop. `events` logs every group start and end with the trainer's
    version at the time.

        >>> worker = HarnessRolloutWorker("builtin", group_size=2, engine="oracle",
        ...                               harness="pi", progress=False)
        >>> worker.rollout_buffer.qsize(), worker.model_version, worker.group_size
        (0, 0, 2)

    Then `worker.start()`; a trainer takes `worker.rollout_buffer.get()` samples;
    `worker.stop()` (tests/test_async_grpo.py runs it with Pi).
    """

    def __init__(
        self,
        tasks: TaskSpec | list[Task] = "builtin",
        *,
        group_size: int = 4,
        groups_in_flight: int = 2,
        executor: EpisodeExecutor | ExecutorSpec = "threads",
        config: EpisodeConfig | None = None,
        train_auxiliary: bool = False,
        reward_fn: Callable[[Sequence[EpisodeResult]], Sequence[float]] | None = None,
        on_group: Callable[[list[EpisodeResult], list[Any]], None] | None = None,
        queue_maxsize: int = 1024,
        max_groups_per_version: int | None = None,
        seed: int = 0,
        stop_timeout_s: float = 60.0,
        **settings: Any,
    ) -> None:
        if group_size < 1 or groups_in_flight < 1:
            raise ValueError("group_size and groups_in_flight must be positive")
        if max_groups_per_version is not None and max_groups_per_version < 1:
            raise ValueError("max_groups_per_version must be positive (or None: no cap)")
        given = {"progress": False} if config is None else {}
        given.update(settings)
        self.config = EpisodeConfig.build(config, **given)
        self.tasks = load_tasks(tasks)
        self.group_size = group_size
        self.groups_in_flight = groups_in_flight
        self.train_auxiliary = train_auxiliary
        self.reward_fn = reward_fn
        self.on_group = on_group
        self.max_groups_per_version = max_groups_per_version
        self.stop_timeout_s = float(stop_timeout_s)
        self.rollout_buffer: queue.Queue[Any] = queue.Queue(maxsize=queue_maxsize)
        self.metrics_queue: queue.Queue[dict[str, Any]] = queue.Queue(maxsize=4096)
        self.model_version = 0
        self.events: list[dict[str, Any]] = []
        self.counts: Counter[str] = Counter()
        self._executor_spec = executor
        self._executor: EpisodeExecutor | None = None
        self._rng = np.random.default_rng(seed)
        self._next_group = 0
        self._started_per_version: Counter[int] = Counter()
        self._running: list[_Group] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._heartbeat = time.time()
        self._pushed_at = time.monotonic()

    @property
    def _builds_executor(self) -> bool:
        return isinstance(self._executor_spec, (str, RayCluster, ExecutorFactory))

    # --- RolloutWorkerProtocol ------------------------------------------------------------

    def start(self) -> None:
        """Begin producing rollouts (called once the first weights are in the engine)."""
        if self._thread is not None:
            return
        if self._builds_executor:
            self._executor = make_executor(self._executor_spec, self.config,  # type: ignore[arg-type]
                                           max_workers=self.group_size * self.groups_in_flight)
        else:
            self._executor = self._executor_spec  # type: ignore[assignment]
        self._heartbeat = time.time()
        self._pushed_at = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="harness-rollouts", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop starting groups and end the episodes in flight now, then release the executor
        this worker built. Its running episodes are stopped (`stop_running`: the CLI killed, the
        sandbox closed, an `infra_error` within about a second, not at `episode_timeout_s`);
        their results are discarded, and a `group_stopped` event records their outcomes.
        Waits at most `stop_timeout_s` for them before closing (and says so if they overran).
        A caller's executor is left running its episodes. Idempotent."""
        self._stop.set()
        executor = self._executor
        if executor is not None and self._builds_executor:
            stop_running = getattr(executor, "stop_running", None)
            if stop_running is not None:
                stop_running()
        if self._thread is not None:
            self._thread.join()
        running, self._running = self._running, []
        if executor is not None and self._builds_executor:
            futures = [f for group in running for f in group.futures]
            _, overran = wait(futures, timeout=self.stop_timeout_s)
            if overran:
                log.warning("%d episodes did not end within %.0fs of stop(); waiting for them",
                            len(overran), self.stop_timeout_s)
        self._executor = None
        if executor is not None and self._builds_executor:
            executor.close()
        for group in running:
            outcomes = [_outcome(f) for f in group.futures]
            self.counts.update(episodes_stopped=len(outcomes))
            self._event("group_stopped", group, outcomes=outcomes)

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to go on as this one would have: the task sampler's RNG,
        the group counter and the counts (groups in flight are not kept: after a resume their
        tasks are drawn afresh). JSON-serialisable."""
        return {"next_group": self._next_group, "counts": dict(self.counts),
                "rng": self._rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()`; before `start()`."""
        if self._thread is not None:
            raise RuntimeError("load_state_dict() goes before start()")
        self._next_group = int(state["next_group"])
        self.counts = Counter(state["counts"])
        self._rng.bit_generator.state = state["rng"]

    def update_model_version(self, model_version: int) -> None:
        self.model_version = int(model_version)

    def check_health(self, stale_after_s: float) -> None:
        if self._error is not None:
            raise RolloutWorkerError(f"the rollout worker failed: {self._error!r}") from self._error
        age = time.time() - self._heartbeat
        if self._thread is not None and not self._stop.is_set() and age > stale_after_s:
            raise RolloutWorkerError(f"the rollout worker has not ticked for {age:.0f}s "
                                     f"(> {stale_after_s:.0f}s): hung")

    # --- the loop -------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._heartbeat = time.time()
                while self._may_start():
                    self._start_group()
                futures = [f for group in self._running for f in group.futures]
                if futures:
                    wait(futures, timeout=0.5, return_when=FIRST_COMPLETED)
                else:  # capped: nothing runs until the trainer's next version
                    self._stop.wait(0.1)
                for group in [g for g in self._running if all(f.done() for f in g.futures)]:
                    if self._stop.is_set():  # stop() accounts for the groups left
                        break
                    self._running.remove(group)
                    self._finish_group(group)
        except BaseException as exc:  # noqa: BLE001 - reported by check_health
            self._error = exc
            log.exception("the rollout worker failed")

    def _may_start(self) -> bool:
        cap = self.max_groups_per_version
        return (len(self._running) < self.groups_in_flight and not self._stop.is_set()
                and (cap is None or self._started_per_version[self.model_version] < cap))

    def _start_group(self) -> None:
        assert self._executor is not None
        task = self.tasks[int(self._rng.integers(len(self.tasks)))]
        group = _Group(self._next_group, task, self.model_version)
        self._next_group += 1
        self._started_per_version[group.version] += 1
        sampling = dict(self.config.sampling)
        for spec in self.config.group_harnesses(group.group_id, self.group_size):
            # No version in the request: each call is labelled with the weights that served it.
            request = EpisodeRequest(spec.name, task, sampling)
            group.futures.append(self._executor.submit(request))
        self._running.append(group)
        self._event("group_start", group)

    def _finish_group(self, group: _Group) -> None:
        results = [f.result() for f in group.futures]
        rewards = np.asarray(self.reward_fn(results) if self.reward_fn else
                             [r.reward for r in results], dtype=np.float64)
        keep = np.array([not _dropped(r) for r in results], dtype=np.bool_)
        advantages, all_equal = group_advantages(rewards, self.group_size, keep=keep)
        samples = []
        for result, reward, advantage, kept in zip(results, rewards, advantages, keep):
            if kept:
                samples += segment_samples(
                    result.trace.to_dicts(), advantage=float(advantage), group_id=group.group_id,
                    reward=float(reward), passed=result.outcome == "passed",
                    train_auxiliary=self.train_auxiliary)
        self._event("group_end", group, n_samples=len(samples),
                    outcomes=[r.outcome for r in results],
                    versions=[[s.policy_versions for s in r.trace.segments] for r in results])
        if self.on_group is not None:
            self.on_group(results, samples)
        if self.max_groups_per_version is not None and len(samples) < len(results):
            # Short of a sample per episode (one dropped, or without a trainable segment): the
            # slot goes back, or a capped schedule would wait forever for its step's samples.
            self._started_per_version[group.version] -= 1
        lags = Counter(self.model_version - s.model_version for s in samples)
        self._push(samples)
        n = len(results)
        now = time.monotonic()
        self.counts.update(episodes=n, samples=len(samples), groups=1)
        self._metrics({
            "rollout/episodes_per_s": (float(n), now - self._pushed_at),
            "rollout/samples_total": float(len(samples)),
            "rollout/queue_depth": float(self.rollout_buffer.qsize()),
            "rollout/reward_mean": (float(rewards[keep].sum()), float(keep.sum())),
            "rollout/pass_rate": (float(sum(r.outcome == "passed" for r in results)), float(n)),
            "rollout/dropped_episodes_total": float(n - keep.sum()),
            "rollout/zero_advantage_groups_total": float(bool(all_equal.all())),
            "rollout/segments_per_episode": (float(sum(len(r.trace.segments) for r in results)),
                                             float(n)),
            **{f"staleness/at_push_lag_{k}_total": float(v) for k, v in lags.items()},
        })
        self._pushed_at = now

    def _push(self, samples: list[Any]) -> None:
        for sample in samples:
            sample.enqueued_at = time.time()
            while not self._stop.is_set():
                try:
                    self.rollout_buffer.put(sample, timeout=0.5)
                    break
                except queue.Full:  # backpressure: the trainer is behind
                    self._heartbeat = time.time()

    def _metrics(self, values: dict[str, Any]) -> None:
        try:
            self.metrics_queue.put_nowait(values)
        except queue.Full:
            pass  # never block rollouts on metrics

    def _event(self, kind: str, group: _Group, **details: Any) -> None:
        event = {"kind": kind, "time": time.monotonic(), "group": group.group_id,
                 "task": group.task.instance_id, "version": group.version,
                 "trainer_version": self.model_version, **details}
        self.events.append(event)
        log.info("%s group=%d task=%s started_at_version=%d trainer_version=%d", kind,
                 group.group_id, group.task.instance_id, group.version, self.model_version)


def segment_samples(
    trace: Sequence[dict[str, Any]],
    *,
    advantage: float,
    group_id: int,
    reward: float,
    passed: bool = False,
    train_auxiliary: bool = False,
) -> list[Any]:
    """One TRL `RolloutSample` per trainable segment of an episode's trace (exported segments,
    `trace.SEGMENT_SCHEMA`): `input_ids` = prompt + response, `completion_mask` = 0 over the
    prompt then the segment's `loss_mask`, `old_log_probs` = 0.0 over the prompt then its p_old
    (TRL's layout: position p holds token p's logprob), `model_version` its oldest serving
    version, `call_spans` each call's sampling (raises `UnscorableSample` where a sampled
    token's call recorded none). A segment is trainable when its role is `agent` (or `auxiliary` with
    `train_auxiliary`) and it holds at least one sampled token."""
    roles = TRAINED_ROLES if train_auxiliary else TRAINED_ROLES[:1]
    samples = []
    for segment in trace:
        if segment["role"] not in roles or not any(segment["loss_mask"]):
            continue
        prompt, n = list(segment["prompt_ids"]), len(segment["prompt_ids"])
        samples.append(harness_sample_class()(
            prompt=[], completion=[],  # messages: the trace holds token ids only
            input_ids=np.asarray(prompt + list(segment["response_ids"]), dtype=np.int64),
            completion_mask=np.asarray([0] * n + list(segment["loss_mask"]), dtype=np.int64),
            old_log_probs=np.asarray([0.0] * n + list(segment["response_logprobs"]),
                                     dtype=np.float32),
            advantage=float(advantage),
            model_version=int(segment["policy_version"]),
            group_id=int(group_id),
            metrics={"reward": float(reward), "rollout/passed": float(passed)},
            call_spans=call_spans(segment),
        ))
    return samples


@functools.cache
def harness_sample_class() -> type:
    """TRL's `RolloutSample` plus the sampling of each call (`call_spans`, see
    `integrations/rescore.py`), so the trainer re-scores each token as it was drawn. Built on
    first use: this module imports without TRL."""
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

    @dataclass(slots=True)
    class HarnessSample(RolloutSample):
        call_spans: tuple[CallSpan, ...] = ()

    return HarnessSample


def _outcome(future: Future[EpisodeResult]) -> str:
    """A stopped group's episode: its outcome, or `not_started` (cancelled in the queue)."""
    if future.cancelled():
        return "not_started"
    return future.result().outcome if future.done() else "still_running"


def _dropped(result: EpisodeResult) -> bool:
    """Our failures stay out of a group's baseline and the batch (as `DropInfraErrors`)."""
    return result.outcome == "infra_error" or bool(result.reward_breakdown.get("drop"))
