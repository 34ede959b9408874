"""Every limit and timing of the proxy, in one record (`harness-gym serve` has a flag for each).

The request limits are sized from real CLI traffic: Claude Code's first request is ~78 KB (64 KB
of it tool JSON, 24 tools), long sessions reach a few MB before the CLI compacts, and no built-in
CLI sends more than a few dozen tools. Everything above that is refused before it costs work.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .events import CallProgress


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass
class ProxySettings:
    default_max_tokens: int = field(
        default=4096, metadata=_help("answer length when neither client nor session sets one"))
    # How long a call waits for the engine's first token before the answer starts (so an engine
    # that is down still gets a proper HTTP error), and how often it pings after that.
    first_token_grace_s: float = field(
        default=1.0, metadata=_help("wait this long for the first token before answering"))
    keepalive_s: float = field(
        default=5.0, metadata=_help("ping a streaming client this often while nothing is sampled"))

    # --- requests: each over-limit request gets its dialect's 413 or 400 ---
    max_body_bytes: int = field(
        default=8 * 1024 * 1024, metadata=_help("request body limit (413 above it)"))
    max_messages: int = field(
        default=10_000, metadata=_help("messages (input items) per request (400 above it)"))
    max_tools: int = field(default=512, metadata=_help("tools per request (400 above it)"))
    max_calls_in_flight_per_session: int = field(
        default=16, metadata=_help("concurrent calls per session (429 above it)"))

    # --- connections (see `connections.py`) ---
    header_timeout_s: float = field(
        default=10.0, metadata=_help("deadline for a request's headers (408, then closed)"))
    body_timeout_s: float = field(
        default=30.0, metadata=_help("deadline for a request's body, from its headers"))
    max_connections: int = field(
        default=4096, metadata=_help("open connections; idle ones make room for new ones"))
    gil_switch_interval_s: float = field(
        default=0.001, metadata=_help("lower the interpreter's GIL switch interval to this, so "
                                      "parsing a large request delays other calls little"))

    # --- sessions ---
    max_sessions: int = field(
        default=1024, metadata=_help("sessions open at once (429 on POST /sessions above it)"))
    session_idle_timeout_s: float = field(
        default=3600.0, metadata=_help("a session with no call for this long expires (401)"))

    # Observer of every call's progress; runs on the proxy's event loop, so it must be quick.
    # May be set while the proxy runs (the CLI's progress display does).
    on_progress: Callable[[CallProgress], None] | None = None

    def __post_init__(self) -> None:
        for spec in _numeric_fields():
            value = getattr(self, spec.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"ProxySettings.{spec.name} must be a positive number, "
                                 f"got {value!r}")


def add_setting_flags(parser: argparse.ArgumentParser) -> None:
    """One `--flag-name` per setting (`harness-gym serve`), defaulting to the setting's default."""
    group = parser.add_argument_group("proxy limits and timings")
    for spec in _numeric_fields():
        kind = float if spec.type in ("float", float) else int
        group.add_argument(
            "--" + spec.name.replace("_", "-"), type=kind, default=spec.default,
            help=f"{spec.metadata['help']} (default: {spec.default})",
        )


def settings_from_flags(args: argparse.Namespace) -> ProxySettings:
    return ProxySettings(**{spec.name: getattr(args, spec.name) for spec in _numeric_fields()})


def _numeric_fields() -> list:
    """The limits and timings (every field with a help text; not the observer)."""
    return [spec for spec in fields(ProxySettings) if "help" in spec.metadata]
