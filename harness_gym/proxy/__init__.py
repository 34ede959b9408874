"""The interception proxy: dialect routes in, engine tokens out, token-faithful traces kept."""

from .bridge import PromptBridge, PromptPlan
from .canonical import AssistantTurn, ChatRequest, Message, ToolCall, ToolSpec
from .errors import ProxyError
from .model_call import CallProgress, ProxySettings
from .rendering import PromptRenderer
from .server import InterceptionProxy
from .sessions import ProxySession

__all__ = [
    "AssistantTurn",
    "CallProgress",
    "ChatRequest",
    "InterceptionProxy",
    "Message",
    "PromptBridge",
    "PromptPlan",
    "PromptRenderer",
    "ProxyError",
    "ProxySession",
    "ProxySettings",
    "ToolCall",
    "ToolSpec",
]
