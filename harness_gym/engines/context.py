"""An engine's context window when it is known before the engine loads.

`make()` checks each harness's `min_context` against it (`harness_gym.config`), so a model too
small for a CLI fails at once with a clear message instead of at the first episode. Only what
costs nothing is read: an `Engine` object's `max_context`, or the `config.json` of a local model
(`hf:PATH`, or the converted `smollm2` / `tiny` caches). A remote engine's window (`vllm:URL`)
is known once it loads; each episode checks it again then (`EpisodeRunner`).
"""

from __future__ import annotations

import json
from pathlib import Path

from ._cache import CACHE_NAMES, cache_root
from .base import Engine

# Specs that load a cached model directory (`oracle` serves tiny's tokens and scores).
_CACHED = {"auto": "smollm2", "smollm2": "smollm2", "tiny": "tiny", "oracle": "tiny"}


def declared_context(engine: str | Engine) -> int | None:
    """The context window in tokens, or None when it cannot be read without loading."""
    if isinstance(engine, Engine):
        return int(engine.max_context)
    name, _, arg = engine.strip().partition(":")
    if name == "hf" and arg:
        directory = Path(arg.partition("?")[0]).expanduser()
    elif name in _CACHED:
        directory = cache_root() / CACHE_NAMES[_CACHED[name]]
    else:
        return None
    return _config_window(directory / "config.json")


def _config_window(path: Path) -> int | None:
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # not there yet (converted on first load) or unreadable: checked later
    if not isinstance(config, dict):
        return None
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    value = text.get("max_position_embeddings")
    return value if isinstance(value, int) and value > 0 else None
