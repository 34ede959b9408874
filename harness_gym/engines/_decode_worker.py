"""The thread that owns an in-process causal LM and runs every forward pass on it.

Why a thread: generation must not block the event loop the proxy serves HTTP on, and torch
releases the GIL inside its kernels. Why exactly one: one owner means no two forwards race on the
weights or fight over the same CPU cores.

Requests are served round-robin, one model step per active request per round, each with its own
`DynamicCache`: several harness episodes share one engine, and a CLI with an idle timeout stalls
if its request waits for another's to finish. There is no cross-request batching on purpose:
batched numerics depend on what else is in the batch (padding, shapes), so the same seed would
no longer give the same tokens, nor would p_old equal a lone re-score.

A prompt is prefilled in one forward, after the longest prefix of it that an earlier request
computed (`PrefixKVCache`): the next call of an episode starts with the previous call's prompt
and completion, and every episode of a harness with the same system prompt and tools. Each
request's keys and values are offered to that cache after its prefill and when it ends. With SDPA and no explicit mask that takes torch's
memory-bounded causal kernel: 25k tokens of the tiny model in ~2.6 s on one core (~1.4 s on two)
and ~+170 MB, where chunked prefill (which needs an explicit mask) was 2-3x slower and 4x larger
at 60k tokens, and eager attention took 22 GB. The price: a long prefill pauses the other streams
(and an abort waits for it to end).
"""

from __future__ import annotations

import inspect
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from ._sampling import sample_token
from .base import EngineError, SamplingParams, TokenChunk
from .prefix_cache import DEFAULT_MAX_BYTES, PrefixKVCache, cache_kwarg

T = TypeVar("T")
Deliver = Callable[[TokenChunk | BaseException], object]


@dataclass(eq=False)
class DecodeRequest:
    """One stream's state. `deliver` hands a chunk (or the error that ended the stream) to the
    consumer; it is called on the worker thread and must be thread-safe."""

    prompt_ids: list[int]
    sampling: SamplingParams
    stop_token_ids: frozenset[int]
    generator: torch.Generator
    deliver: Deliver
    # Called on the worker thread when the request is admitted, before its first forward (the
    # weights it will be served with are fixed from then on: see `DecodeWorker.pause`).
    on_admit: Callable[[], object] | None = None
    # Written by the consumer's thread, read by the worker; a bool store is atomic under the GIL.
    cancelled: bool = False
    cache: Any = None
    next_input: torch.Tensor | None = None
    generated: list[int] = field(default_factory=list)
    fingerprint: int = 0  # the weights' fingerprint at prefill (see prefix_cache)

    @property
    def n_generated(self) -> int:
        return len(self.generated)

    def cancel(self) -> None:
        self.cancelled = True


class DecodeWorker:
    """Serves `DecodeRequest`s and one-off calls (scoring) on a single daemon thread."""

    def __init__(
        self,
        model: Any,
        *,
        max_context: int,
        name: str = "policy",
        num_threads: int | None = None,
        prefix_cache_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self._model = model
        self.prefix_cache = PrefixKVCache(model, max_bytes=prefix_cache_bytes)
        # One core is left to everything else: the event loop that streams each token, the harness
        # CLIs, the tests. OpenMP teams spin at their barriers, so when every core runs one, a
        # descheduled team thread (or the loop's thread holding the GIL) stalls each op. Measured
        # on 2 cores with other work running: SmolLM2's 38-token prefill took 0.2 s on 1 thread
        # and 0.8-2.0 s on 2; tiny's decode swung between 47 and 1400 tok/s on 2 threads and held
        # ~1300 on 1. On an idle machine 2 threads prefill 25k tiny tokens 2x faster (1.4 s vs
        # 2.6 s): pass num_threads to take that. set_num_threads is per thread under OpenMP, so
        # setting it on the worker touches no other thread.
        self._num_threads = num_threads or max(1, _usable_cores() - 1)
        self._max_context = max_context
        self._device = model.device
        self._vocab_size = int(model.get_input_embeddings().num_embeddings)
        self._cache_kwarg = cache_kwarg(model)
        self._keeps_logits = "logits_to_keep" in inspect.signature(model.forward).parameters
        self._cond = threading.Condition()
        self._incoming: list[DecodeRequest] = []
        self._calls: list[tuple[Callable[[], Any], Future[Any]]] = []
        self._active: list[DecodeRequest] = []
        self._closed = False
        self._paused = False
        self._failure: BaseException | None = None
        self.tokens_generated = 0
        self._thread = threading.Thread(target=self._run, name=f"engine-{name}", daemon=True)
        self._thread.start()

    # -- called from other threads -------------------------------------------------------------

    @property
    def active_requests(self) -> int:
        return len(self._active) + len(self._incoming)

    @property
    def running_requests(self) -> int:
        """Admitted requests still generating (not those a pause holds back)."""
        return len(self._active)

    def check_open(self) -> None:
        if self._failure is not None:
            raise EngineError(f"the engine's worker thread died: {self._failure!r}")
        if self._closed:
            raise EngineError("the engine is closed")

    def submit(self, request: DecodeRequest) -> None:
        with self._cond:
            self.check_open()
            self._incoming.append(request)
            self._cond.notify()

    def call(self, fn: Callable[[], T]) -> Future[T]:
        """Run `fn` on the worker thread between two rounds."""
        future: Future[T] = Future()
        with self._cond:
            self.check_open()
            self._calls.append((fn, future))
            self._cond.notify()
        return future

    def score(self, prompt_ids: list[int], completion_ids: list[int]) -> Future[list[float]]:
        return self.call(lambda: self._score(prompt_ids, completion_ids))

    def pause(self) -> None:
        """Admit no new request; the admitted ones run to their end. New requests wait, and
        `call`s still run, so weights can be swapped between calls, never mid-generation."""
        with self._cond:
            self._paused = True

    def resume(self) -> None:
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no admitted request is running (with `pause`: drained); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._closed or not self._active, timeout)

    def close(self, timeout: float | None = None) -> None:
        """Stop after the current step; open streams end with finish_reason "abort"."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    # -- the worker thread ---------------------------------------------------------------------

    def _run(self) -> None:
        torch.set_num_threads(self._num_threads)
        try:
            with torch.inference_mode():
                while self._serve_round():
                    pass
        except BaseException as exc:  # noqa: BLE001 - a bug in the loop itself, not one request
            self._failure = exc
        finally:
            self._shutdown()

    def _serve_round(self) -> bool:
        with self._cond:
            while not (self._closed or self._calls or self._active
                       or (self._incoming and not self._paused)):
                self._cond.wait()
            if self._closed:
                return False
            admitted: list[DecodeRequest] = []
            if not self._paused:
                # Under the lock, so a `pause` + `wait_idle` that follows sees them running.
                admitted, self._incoming = self._incoming, []
                self._active.extend(admitted)
            calls, self._calls = self._calls, []
        for request in admitted:
            if request.on_admit is not None:
                request.on_admit()
        for fn, future in calls:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except Exception as exc:  # noqa: BLE001 - the caller gets it from the future
                    future.set_exception(exc)
        for request in list(self._active):
            if request.cancelled:
                if request.cache is not None:  # what it computed still serves a retry
                    self._offer(request, request.prompt_ids + request.generated[:-1])
                self._active.remove(request)
            elif self._step_or_fail(request):
                self._active.remove(request)
        if not self._active:
            with self._cond:
                self._cond.notify_all()  # for wait_idle
        return True

    def _shutdown(self) -> None:
        with self._cond:
            self._closed = True
            ending = self._active + self._incoming
            self._active, self._incoming = [], []
            calls, self._calls = self._calls, []
        ended: TokenChunk | BaseException = (
            TokenChunk([], [], "abort")
            if self._failure is None
            else EngineError(f"the engine's worker thread died: {self._failure!r}")
        )
        for request in ending:
            self._send(request, ended)
        for _, future in calls:
            if future.set_running_or_notify_cancel():
                future.set_exception(EngineError("the engine is closed"))

    def _send(self, request: DecodeRequest, item: TokenChunk | BaseException) -> None:
        try:
            request.deliver(item)
        except RuntimeError:  # the consumer's event loop is closed: nobody is listening
            request.cancelled = True

    def _step_or_fail(self, request: DecodeRequest) -> bool:
        """Advance one token; True when the request is finished (done, failed or abandoned)."""
        try:
            return self._step(request)
        except Exception as exc:  # noqa: BLE001 - one failed request must not stop the others
            self._send(request, EngineError(f"generation failed: {exc!r}"))
            return True

    def _step(self, request: DecodeRequest) -> bool:
        prefill = request.cache is None
        if prefill:
            inputs = torch.tensor([request.prompt_ids], dtype=torch.long)
            problem = self._invalid_ids(inputs)
            if problem:
                self._send(request, ValueError(f"prompt_ids {problem}"))
                return True
            request.fingerprint = self.prefix_cache.fingerprint()
            request.cache, reused = self.prefix_cache.restore(request.prompt_ids)
            inputs = inputs[:, reused:].to(self._device)
        else:
            assert request.next_input is not None
            inputs = request.next_input
        logits = self._last_logits(inputs, request.cache)
        if prefill:
            self._offer(request, request.prompt_ids)
        token, logprob = sample_token(logits, request.sampling, request.generator)
        request.generated.append(token)
        self.tokens_generated += 1
        finish: Any = None
        if token in request.stop_token_ids:
            finish = "stop"
        elif (
            request.n_generated >= request.sampling.max_tokens
            or len(request.prompt_ids) + request.n_generated >= self._max_context
        ):
            finish = "length"
        self._send(request, TokenChunk([token], [logprob], finish))
        if finish is not None:
            # The cache holds every token but the last sampled one (never run through the model).
            self._offer(request, request.prompt_ids + request.generated[:-1])
            return True
        request.next_input = torch.tensor([[token]], dtype=torch.long, device=self._device)
        return False

    def _offer(self, request: DecodeRequest, ids: list[int]) -> None:
        self.prefix_cache.add(ids, request.cache, fingerprint=request.fingerprint)

    def _last_logits(self, inputs: torch.Tensor, cache: Any) -> torch.Tensor:
        kwargs: dict[str, Any] = {self._cache_kwarg: cache, "use_cache": True}
        if self._keeps_logits:
            kwargs["logits_to_keep"] = 1  # a 25k-token prefill would else build 25k x vocab logits
        logits = self._model(input_ids=inputs, **kwargs).logits
        return logits[0, -1].float().cpu()

    def _score(self, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
        if not completion_ids:
            return []
        n = len(completion_ids)
        inputs = torch.tensor([prompt_ids + completion_ids[:-1]], dtype=torch.long)
        targets = torch.tensor(completion_ids, dtype=torch.long)
        problem = self._invalid_ids(inputs) or self._invalid_ids(targets)
        if problem:
            raise ValueError(f"token ids {problem}")
        kwargs: dict[str, Any] = {"use_cache": False}
        if self._keeps_logits:
            kwargs["logits_to_keep"] = n
        logits = self._model(input_ids=inputs.to(self._device), **kwargs).logits[0, -n:]
        logprobs = torch.log_softmax(logits.float().cpu(), dim=-1)
        return logprobs.gather(1, targets[:, None]).squeeze(1).tolist()

    def _invalid_ids(self, ids: torch.Tensor) -> str | None:
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or high >= self._vocab_size:
            return (
                f"hold {low if low < 0 else high}, outside the vocabulary [0, {self._vocab_size})"
            )
        return None


def _usable_cores() -> int:
    if hasattr(os, "sched_getaffinity"):  # Linux: honours taskset and container CPU sets
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
