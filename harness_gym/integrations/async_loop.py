"""`AsyncGRPOLoop`: asynchronous GRPO on the CPU, where TRL's `AsyncGRPOTrainer` cannot run.

TRL 1.16's `AsyncGRPOTrainer` is the trainer to use on a CUDA machine: pass it
`rollout_worker=HarnessRolloutWorker(...)` and a `weight_transfer`
(`integrations/weight_transfer.py`). It does not run on the CPU even with both protocols
supplied (measured here, TRL 1.16.0, torch 2.13 CPU; tests/test_async_grpo.py pins it):

1. `trl/experimental/async_grpo/async_grpo_trainer.py:1240` (`__init__`) calls
   `get_peak_flops_per_device`, whose first line (`trl/trainer/utils.py:1824`) is
   `torch.cuda.get_device_name(...)`: "Torch not compiled with CUDA enabled".
2. Past that, every forward fails: the model is loaded with `attn_implementation="tree_fa3"`
   (`async_grpo_trainer.py:1086`), whose kernel (`trl/experimental/async_grpo/packing.py:161-165`,
   `_flash_attn`) is FlashAttention 3 fetched with `kernels.get_kernel` from the Hub: a CUDA
   kernel, a package not installed, and a download.

This loop is the same capability on the CPU, built on the same two protocols so the same
worker and transfer serve both: it syncs the weights (`pause`, `send_weights`, `resume`, then
`update_model_version`, as `_sync_weight_merged` does), starts the worker, and for each optimiser
step takes `per_device_train_batch_size * gradient_accumulation_steps` samples from the worker's
queue while episodes keep running, applies the staleness rule, and steps with the loss of
`AsyncGRPOTrainer.compute_loss` (`async_grpo_trainer.py:1527-1544`): per token
`-min(r A, clip(r, 1-eps, 1+eps_high) A)` with `r = exp(logp - p_old)` against the p_old that
served the token, summed over the micro-batch's trained tokens and divided by their count.
It reads its settings from TRL's `AsyncGRPOConfig`, so a run moves to `AsyncGRPOTrainer`
unchanged.

Each token is re-scored under the sampling its call recorded in the trace (temperature, top-k,
top-p, per call: `integrations/rescore.py`), not the config's `temperature`: the worker samples
with its own `sampling=`, and a ratio against p_old of another distribution is biased. A sample
that cannot be re-scored exactly (a call with no recorded sampling) stops the run with
`UnscorableSample`.

Staleness (`stale=`): a sample whose oldest serving version lags the trainer by more than
`args.max_staleness` updates is `"drop"`ped (as `AsyncGRPOTrainer` does), or kept with
importance weights (`"weight"`): its tokens are weighted by `min(pi_current / p_old, C)`
(TRL's `vllm_importance_sampling_mode="token_truncate"` with `C = importance_clip_max`,
default TRL's 3.0) instead of being PPO-clipped against p_old, which would zero most of a very
stale sample's gradient. Counts go to the log (`staleness/dropped_total`,
`staleness/weighted_total`, `staleness/lag_<k>_total` histogram).
"""

from __future__ import annotations

import logging
import os
import queue
import random
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from ..wrappers import is_stale
from .checkpoint import latest_checkpoint, read_checkpoint, write_checkpoint
from .rescore import UnscorableSample, rescored_logprobs

log = logging.getLogger(__name__)

__all__ = ["AsyncGRPOLoop", "grpo_token_loss", "reduce_metrics"]

StaleMode = Literal["drop", "weight"]
# How long one blocking `get` on the rollout queue waits before the worker's health is checked.
POLL_S = 1.0


@dataclass
class _Taken:
    sample: Any
    lag: int
    weighted: bool  # stale, kept with importance weights


class AsyncGRPOLoop:
    """Asynchronous GRPO: `train()` runs `args.max_steps` optimiser steps on samples the
    worker produces meanwhile (see the module docstring).

    `model` is the trainer's model (its own tensors; the engine has a copy that the transfer
    updates). `args` is TRL's `AsyncGRPOConfig`; read: `max_steps`, `per_device_train_batch_size`,
    `gradient_accumulation_steps`, `learning_rate`, `adam_*`, `weight_decay`, `max_grad_norm`,
    `epsilon`, `epsilon_high`, `max_staleness`, `weight_sync_steps`,
    `heartbeat_stale_after_s`, `logging_steps`, `seed`, the LR schedule (`lr_scheduler_type`,
    `warmup_steps`/`warmup_ratio`, `lr_scheduler_kwargs`) and checkpointing (`save_strategy`,
    `save_steps`, `save_total_limit`, `output_dir`). `log_history` holds one dict per step;
    `events` the step and sync times (the worker's `events` hold the episodes'); `counts` the
    run's totals (`samples_trained`, `dropped_stale`, `weighted_stale`).

    `train(resume_from_checkpoint=True)` (or a checkpoint's path) goes on from the newest
    `output_dir/checkpoint-<step>`: the weights, the optimiser and scheduler state, the step,
    the policy version (the first sync after the resume re-labels the same version), the
    counters, the log, the RNGs and the worker's state (`state_dict()`, where it has one).
    Groups that were in flight at the save are not kept: the worker starts afresh.

    On the tiny model with Pi (tests/test_async_grpo.py)::

        transfer = EngineWeightTransfer.serving_copy(model, tokenizer)
        worker = HarnessRolloutWorker("builtin", group_size=2, harness="pi",
                                      engine=transfer.engine, sampling={"max_tokens": 32})
        AsyncGRPOLoop(model, AsyncGRPOConfig(output_dir="out", max_steps=3, use_cpu=True,
                                             per_device_train_batch_size=2),
                      worker, transfer).train()
        transfer.engine.close()
    """

    def __init__(
        self,
        model: Any,
        args: Any,
        rollout_worker: Any,
        weight_transfer: Any,
        *,
        stale: StaleMode = "drop",
        importance_clip_max: float = 3.0,
        on_log: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        if stale not in ("drop", "weight"):
            raise ValueError(f"stale is 'drop' or 'weight', got {stale!r}")
        if args.max_steps <= 0:
            raise ValueError("AsyncGRPOLoop trains for args.max_steps steps: set max_steps > 0")
        self.model = model
        self.args = args
        self.worker = rollout_worker
        self.transfer = weight_transfer
        self.stale: StaleMode = stale
        self.importance_clip_max = float(importance_clip_max)
        self.on_log = on_log
        self.model_version = 0
        self.global_step = 0
        self.log_history: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.counts: Counter[str] = Counter()
        self._metrics: dict[str, list[Any]] = defaultdict(list)
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad], lr=args.learning_rate,
            betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_epsilon,
            weight_decay=args.weight_decay)
        self.scheduler = _scheduler(self.optimizer, args)

    @property
    def samples_per_step(self) -> int:
        return self.args.per_device_train_batch_size * self.args.gradient_accumulation_steps

    # --- the loop -------------------------------------------------------------------------

    def train(self, resume_from_checkpoint: str | os.PathLike[str] | bool | None = None
              ) -> list[dict[str, Any]]:
        """Sync, start the worker, step up to `max_steps`, stop (also on an error: the
        worker's episodes end at once). Answers `log_history`. `resume_from_checkpoint`: a
        checkpoint's path, or True for the newest under `output_dir` (see the class)."""
        torch.manual_seed(self.args.seed)
        if resume_from_checkpoint:
            self.load_checkpoint(resume_from_checkpoint)
        self.transfer.init_weight_transfer()
        try:
            # Version 1 before the first rollout, as AsyncGRPOTrainer; after a resume, the
            # checkpoint's version again.
            self._sync_weights()
            self.worker.start()
            while self.global_step < self.args.max_steps:
                self._step()
                if self.global_step % self.args.weight_sync_steps == 0:
                    self._sync_weights()
                self._log()
                if self._saves_now():
                    self.save_checkpoint()
        finally:
            self.worker.stop()
            self.transfer.destroy()
        return self.log_history

    # --- checkpoints ----------------------------------------------------------------------

    def save_checkpoint(self) -> Path:
        """`output_dir/checkpoint-<global_step>` (see `integrations/checkpoint.py`)."""
        tensors = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                   "scheduler": self.scheduler.state_dict(), "rng_state": _torch_rng()}
        version, py_rng = self.model_version, random.getstate()
        state = {"global_step": self.global_step, "model_version": version,
                 "counts": dict(self.counts), "log_history": self.log_history,
                 "python_rng": [py_rng[0], list(py_rng[1]), py_rng[2]],
                 "worker": self.worker.state_dict() if hasattr(self.worker, "state_dict")
                 else None}
        keep = self.args.save_total_limit
        path = write_checkpoint(self.args.output_dir, self.global_step, tensors, state,
                                keep=int(keep) if keep else None)
        self._event("checkpoint", step=self.global_step, path=str(path))
        return path

    def load_checkpoint(self, checkpoint: str | os.PathLike[str] | bool) -> None:
        """Restore a `save_checkpoint()`; True: the newest under `output_dir`. Before `train`
        starts the worker."""
        path = latest_checkpoint(self.args.output_dir) if checkpoint is True else checkpoint
        if path is None:
            raise FileNotFoundError(f"resume_from_checkpoint=True: no checkpoint-<step> under "
                                    f"{self.args.output_dir}")
        tensors, state = read_checkpoint(path)
        self.model.load_state_dict(tensors["model"])
        self.optimizer.load_state_dict(tensors["optimizer"])
        self.scheduler.load_state_dict(tensors["scheduler"])
        _set_torch_rng(tensors["rng_state"])
        py_rng = state["python_rng"]
        random.setstate((py_rng[0], tuple(py_rng[1]), py_rng[2]))
        self.global_step = int(state["global_step"])
        # The sync at the start of train() moves the version back to the checkpoint's; our
        # transfers count their syncs, so theirs continues from there too.
        self.model_version = int(state["model_version"]) - 1
        if hasattr(self.transfer, "version"):
            self.transfer.version = self.model_version
        self.counts = Counter(state["counts"])
        self.log_history = list(state["log_history"])
        if state.get("worker") is not None and hasattr(self.worker, "load_state_dict"):
            self.worker.load_state_dict(state["worker"])
        self._event("resumed", step=self.global_step, path=str(path))

    def _saves_now(self) -> bool:
        strategy = str(getattr(self.args.save_strategy, "value", self.args.save_strategy))
        if strategy == "no":
            return False
        if strategy != "steps":
            raise ValueError(f"AsyncGRPOLoop saves by steps (save_strategy='steps' or 'no'), "
                             f"got {strategy!r}")
        every = self.args.save_steps
        every = max(1, round(every * self.args.max_steps)) if every < 1 else int(every)
        return self.global_step % every == 0 or self.global_step == self.args.max_steps

    def _step(self) -> None:
        started = time.perf_counter()
        self._event("step_start", step=self.global_step + 1)
        taken, wait_s = self._take(self.samples_per_step)
        self._event("step_compute", step=self.global_step + 1)  # the samples are in: compute
        self.model.train()
        size = self.args.per_device_train_batch_size
        micro_batches = [taken[i:i + size] for i in range(0, len(taken), size)]
        loss_sum = 0.0
        for batch in micro_batches:
            # AsyncGRPOTrainer's normalisation: a micro-batch's token-loss sum over its trained
            # tokens, averaged over the accumulation steps.
            n_tokens = max(1, sum(int(t.sample.completion_mask.sum()) for t in batch))
            for t in batch:
                # One sample per forward: unpadded, SDPA takes its causal kernel (3-4x faster
                # on the CPU than a padded batch's explicit mask, measured with the tiny model).
                loss = self._sample_loss(t) / n_tokens / len(micro_batches)
                loss.backward()
                loss_sum += float(loss.detach())
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.args.max_grad_norm)
        learning_rate = self.scheduler.get_last_lr()[0]  # the rate this step is taken at
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.global_step += 1
        self.counts.update(samples_trained=len(taken))
        step_s = time.perf_counter() - started
        self._event("step_end", step=self.global_step)
        m = self._metrics
        m["loss"].append(loss_sum)
        m["grad_norm"].append(float(grad_norm))
        m["learning_rate"].append(learning_rate)
        m["perf/step_s"].append(step_s)
        m["perf/rollout_wait_s"].append(wait_s)
        m["perf/optimizer_idle_frac"].append((wait_s, step_s))
        m["sample/advantage_abs_mean"].append(
            sum(abs(t.sample.advantage) for t in taken) / len(taken))
        for t in taken:
            for key, value in t.sample.metrics.items():
                m[f"sample/{key}" if "/" not in key else key].append(value)

    def _take(self, n: int) -> tuple[list[_Taken], float]:
        """`n` samples, the staleness rule applied; and the seconds spent waiting for them."""
        taken: list[_Taken] = []
        waited = 0.0
        while len(taken) < n:
            t0 = time.perf_counter()
            try:
                sample = self.worker.rollout_buffer.get(timeout=POLL_S)
            except queue.Empty:
                waited += time.perf_counter() - t0
                self.worker.check_health(self.args.heartbeat_stale_after_s)
                continue
            waited += time.perf_counter() - t0
            lag = self.model_version - int(sample.model_version)
            self._metrics[f"staleness/lag_{lag}_total"].append(1.0)
            self._metrics["rollout/queue_depth_at_take"].append(
                float(self.worker.rollout_buffer.qsize()))
            stale = is_stale(self.model_version, sample.model_version, self.args.max_staleness)
            if stale and self.stale == "drop":
                self._metrics["staleness/dropped_total"].append(1.0)
                self.counts.update(dropped_stale=1)
                log.info("dropping a sample of version %d (trainer at %d, max_staleness %d)",
                         sample.model_version, self.model_version, self.args.max_staleness)
                continue
            if stale:
                self._metrics["staleness/weighted_total"].append(1.0)
                self.counts.update(weighted_stale=1)
            taken.append(_Taken(sample, lag, stale))
        return taken, waited

    def _sample_loss(self, taken: _Taken) -> torch.Tensor:
        """The sum of a sample's per-token losses (`grpo_token_loss`) over its trained tokens."""
        sample = taken.sample
        spans = getattr(sample, "call_spans", None)
        if not spans:
            raise UnscorableSample(
                "a sample without call_spans (not made by segment_samples) carries no record of "
                "how its tokens were sampled: its p_old cannot be matched exactly")
        ids = torch.as_tensor(sample.input_ids, dtype=torch.long)[None]
        mask = torch.as_tensor(sample.completion_mask, dtype=torch.float32)[None]
        old = torch.as_tensor(sample.old_log_probs, dtype=torch.float32)[None]
        # Logits only from the position before the first trained token on: a segment's
        # prompt runs to thousands of tokens, its sampled answers to a few dozen.
        keep = ids.shape[1] - int(sample.completion_mask.argmax()) + 1
        logits = self.model(input_ids=ids, logits_to_keep=keep).logits[:, :-1]
        # Token p is scored from position p-1's logits, under the sampling its call drew it
        # with (temperature, top-k, top-p; `integrations/rescore.py`), not the config's.
        first = ids.shape[1] - keep + 1
        logps = rescored_logprobs(logits[0], ids[0, first:], spans, first)[None]
        mask, old = mask[:, first:], old[:, first:]
        per_token = grpo_token_loss(
            logps, old, torch.tensor([[sample.advantage]], dtype=torch.float32),
            torch.tensor([[taken.weighted]]), epsilon=self.args.epsilon,
            epsilon_high=self.args.epsilon_high, importance_clip_max=self.importance_clip_max)
        with torch.no_grad():
            ratio = torch.exp(logps - old)[mask.bool()]
            if ratio.numel():
                self._metrics["policy/ratio_mean"].append(float(ratio.mean()))
                self._metrics["policy/ratio_max"].append(float(ratio.max()))
                self._metrics["policy/ratio_min"].append(float(ratio.min()))
        return (per_token * mask).sum()

    def _sync_weights(self) -> None:
        """`AsyncGRPOTrainer._sync_weight_merged`'s order: pause, send, resume, then the
        version moves and the worker hears of it."""
        started = time.perf_counter()
        self.transfer.pause()
        try:
            self.transfer.send_weights(
                (name, p.detach()) for name, p in self.model.named_parameters())
        finally:
            self.transfer.resume()
        self.model_version += 1
        self.worker.update_model_version(self.model_version)
        self._metrics["perf/weight_sync_s"].append(time.perf_counter() - started)
        self._event("sync", version=self.model_version)

    # --- logging --------------------------------------------------------------------------

    def _log(self) -> None:
        """Drain the worker's metrics, reduce the window, append to `log_history`."""
        while True:
            try:
                for key, value in self.worker.metrics_queue.get_nowait().items():
                    self._metrics[key].append(value)
            except queue.Empty:
                break
        if self.global_step % max(1, int(self.args.logging_steps)) and \
                self.global_step < self.args.max_steps:
            return
        entry = {"step": self.global_step, "model_version": self.model_version,
                 **reduce_metrics(self._metrics)}
        self._metrics.clear()
        self.log_history.append(entry)
        log.info("step %d: %s", self.global_step,
                 ", ".join(f"{k}={v:.4g}" for k, v in entry.items() if isinstance(v, float)))
        if self.on_log is not None:
            self.on_log(entry)

    def _event(self, kind: str, **details: Any) -> None:
        self.events.append({"kind": kind, "time": time.monotonic(), **details})
        log.info("%s %s", kind, details)


def _scheduler(optimizer: torch.optim.Optimizer, args: Any) -> Any:
    """The `Trainer`'s LR schedule from the config, over `max_steps` (stepped once a step)."""
    from transformers import get_scheduler

    return get_scheduler(args.lr_scheduler_type, optimizer,
                         num_warmup_steps=args.get_warmup_steps(args.max_steps),
                         num_training_steps=args.max_steps,
                         scheduler_specific_kwargs=args.lr_scheduler_kwargs or {})


def _torch_rng() -> dict[str, Any]:
    state: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_torch_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def grpo_token_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    weighted: torch.Tensor,
    *,
    epsilon: float,
    epsilon_high: float | None,
    importance_clip_max: float,
) -> torch.Tensor:
    """Per-token loss. Where `weighted` is False: `AsyncGRPOTrainer.compute_loss`'s clipped
    objective against the behaviour logprobs `old_logps`. Where True (a stale sample kept):
    the policy gradient `A * grad(logp)` weighted by `min(exp(logp - old_logps), C)`, detached
    (TRL's `token_truncate` importance sampling, `C = importance_clip_max`).

        >>> lp = torch.log(torch.tensor([[0.5, 0.5]])); old = torch.log(torch.tensor([[0.25, 0.5]]))
        >>> a, no, yes = torch.tensor([[1.0]]), torch.tensor([[False]]), torch.tensor([[True]])
        >>> grpo_token_loss(lp, old, a, no, epsilon=0.2, epsilon_high=None, importance_clip_max=3)
        tensor([[-1.2000, -1.0000]])
        >>> grpo_token_loss(lp, old, a, yes, epsilon=0.2, epsilon_high=None, importance_clip_max=3)
        tensor([[-2., -1.]])
    """
    high = epsilon if epsilon_high is None else epsilon_high
    ratio = torch.exp(logps - old_logps)
    clipped = -torch.min(ratio * advantages,
                         torch.clamp(ratio, 1 - epsilon, 1 + high) * advantages)
    weight = torch.clamp(ratio.detach(), max=importance_clip_max)
    importance = -weight * advantages * torch.exp(logps - logps.detach())
    return torch.where(weighted, importance, clipped)


def reduce_metrics(metrics: dict[str, list[Any]]) -> dict[str, float]:
    """One number per key, by `AsyncGRPOTrainer`'s convention (`_reduce_metric`): a
    `(numerator, denominator)` pair is a rate (sum over sum), a `total` word a counter (sum),
    `max`/`min` words extremes, anything else a mean.

        >>> reduce_metrics({"a/x_total": [1, 2], "r": [(1, 4), (3, 4)], "g": [1.0, 3.0]})
        {'a/x_total': 3.0, 'r': 0.5, 'g': 2.0}
    """
    out: dict[str, float] = {}
    for key, values in metrics.items():
        if not values:
            continue
        if isinstance(values[0], tuple):
            num, den = (sum(float(v[i]) for v in values) for i in (0, 1))
            out[key] = num / den if den else float("nan")
            continue
        words = key.split("/")[-1].split("_")
        floats = [float(v) for v in values]
        if "total" in words:
            out[key] = sum(floats)
        elif "max" in words:
            out[key] = max(floats)
        elif "min" in words:
            out[key] = min(floats)
        else:
            out[key] = sum(floats) / len(floats)
    return out
