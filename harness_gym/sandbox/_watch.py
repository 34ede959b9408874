"""A thread that watches a sandbox during the agent's turn (`_disk.DiskWatch`,
`_pids.PidsWatch`): started with the turn, stopped before anything reads the sandbox."""

from __future__ import annotations

import threading


class TurnWatch:
    """`_run` on a daemon thread from `start()` to `stop()`; `_run` polls `self._stop`."""

    thread_name = "harness-gym-watch"

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start watching (idempotent; a stopped watch stays stopped)."""
        with self._lock:
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._run, name=self.thread_name,
                                                daemon=True)
                self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        raise NotImplementedError
