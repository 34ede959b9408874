"""The interception proxy: dialect routes in, engine tokens out, token-faithful traces kept.

Names are imported on first use: the server pulls in the model stack, which a command line
that only builds its parser (`harness-gym serve --help`) should not wait for.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .bridge import PromptBridge, PromptPlan
    from .canonical import AssistantTurn, ChatRequest, Message, ToolCall, ToolSpec
    from .errors import ProxyError
    from .events import CallProgress
    from .rendering import PromptRenderer
    from .server import InterceptionProxy
    from .sessions import ProxySession
    from .settings import ProxySettings

_WHERE = {
    "AssistantTurn": "canonical",
    "CallProgress": "events",
    "ChatRequest": "canonical",
    "InterceptionProxy": "server",
    "Message": "canonical",
    "PromptBridge": "bridge",
    "PromptPlan": "bridge",
    "PromptRenderer": "rendering",
    "ProxyError": "errors",
    "ProxySession": "sessions",
    "ProxySettings": "settings",
    "ToolCall": "canonical",
    "ToolSpec": "canonical",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
