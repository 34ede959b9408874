"""Stopping billed cloud sandboxes for certain, or saying loudly which could not be stopped.

Neither SDK makes a failed stop hard to miss. huggingface_hub 2.4's `Sandbox.kill()` logs a failed
job cancel and returns (the job keeps running, billed, until its idle timeout); e2b 2.63's
`Sandbox.kill()` raises, and a backend that swallowed the error left the VM running until its
own timeout. `CloudReaper.stop` retries a stop with backoff until the service confirms it; a
sandbox it cannot stop is named in an `UnstoppedSandboxWarning` and tried once more, with the
same backoff, when the backend closes.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections.abc import Callable, Sequence

log = logging.getLogger(__name__)

StopAttempt = Callable[[], bool]  # True once the service confirms the sandbox is stopped

DEFAULT_STOP_DELAYS_S = (0.5, 1.0, 2.0, 4.0)  # the pauses between tries


class UnstoppedSandboxWarning(RuntimeWarning):
    """A cloud sandbox could not be stopped: it may still be running, and billed."""


class CloudReaper:
    """Stops one backend's cloud sandboxes and keeps the ones it could not stop for a last sweep.

    `how_to_stop` is a command a user can run by hand, with `{id}` for the sandbox's id.
    """

    def __init__(
        self, backend: str, how_to_stop: str, delays_s: Sequence[float] = DEFAULT_STOP_DELAYS_S
    ) -> None:
        self.backend = backend
        self.how_to_stop = how_to_stop
        self.delays_s = tuple(delays_s)
        self._unstopped: dict[str, StopAttempt] = {}
        self._lock = threading.Lock()

    def stop(self, sandbox_id: str, attempt: StopAttempt) -> bool:
        """Try `attempt` until it confirms the stop; warn and keep the sandbox if it never does."""
        error = self._retry(attempt)
        if error is None:
            return True
        with self._lock:
            self._unstopped[sandbox_id] = attempt
        self._warn(
            f"{self.backend} sandbox {sandbox_id} could not be stopped after"
            f" {len(self.delays_s) + 1} tries ({error}); it may still be running and billed."
            f" harness-gym tries again when the backend closes; to stop it by hand: "
            + self.how_to_stop.format(id=sandbox_id)
        )
        return False

    def __getstate__(self) -> dict[str, object]:
        # A backend travels to Ray actors by pickle; each process reaps what it started.
        return {"backend": self.backend, "how_to_stop": self.how_to_stop, "delays_s": self.delays_s}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__(**state)  # type: ignore[misc]

    def unstopped(self) -> list[str]:
        with self._lock:
            return list(self._unstopped)

    def sweep(self) -> list[str]:
        """Try every sandbox that could not be stopped once more; the ids still running."""
        with self._lock:
            pending = dict(self._unstopped)
        left = []
        for sandbox_id, attempt in pending.items():
            error = self._retry(attempt)
            if error is None:
                with self._lock:
                    self._unstopped.pop(sandbox_id, None)
                continue
            left.append(sandbox_id)
            self._warn(
                f"{self.backend} sandbox {sandbox_id} is still not stopped as the backend closes"
                f" ({error}); it may be running and billed: "
                + self.how_to_stop.format(id=sandbox_id)
            )
        return left

    def _retry(self, attempt: StopAttempt) -> str | None:
        """None once `attempt` confirmed the stop, else what the last try said."""
        error = "the service never confirmed the stop"
        for delay in (0.0, *self.delays_s):
            time.sleep(delay)
            try:
                if attempt():
                    return None
                error = "the service never confirmed the stop"
            except Exception as exc:  # an SDK or network error: the next try may get through
                error = f"{type(exc).__name__}: {exc}"
                log.debug("stopping a %s sandbox failed: %s", self.backend, error)
        return error

    @staticmethod
    def _warn(message: str) -> None:
        log.warning(message)
        warnings.warn(message, UnstoppedSandboxWarning, stacklevel=3)
