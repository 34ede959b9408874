"""Runs on disk: recording episodes to trace files (`recording`), reading them back and printing
them (`trace_view`), and the self-contained HTML page of a run (`trace_page`)."""

from __future__ import annotations

_RECORDING = ("CallMeter", "RunSummary", "episode_task_ids", "run_episodes")


def __getattr__(name: str):
    # Lazy: reading a trace file should not import the env (gymnasium, engines).
    if name in _RECORDING:
        from . import recording

        return getattr(recording, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = list(_RECORDING)
