from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .pattern import CompiledPattern, compile_pattern


class NotFound(LookupError):
    def __init__(self, path: str) -> None:
        super().__init__(f"no route matches {path!r}")
        self.path = path


@dataclass
class Route:
    template: str
    handler: Callable[..., Any]
    pattern: CompiledPattern


class Router:
    """Dispatch paths to handlers; routes are tried in the order they were added."""

    def __init__(self) -> None:
        self.routes: list[Route] = []

    def add(self, template: str, handler: Callable[..., Any]) -> None:
        self.routes.append(Route(template, handler, compile_pattern(template)))

    def route(self, template: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def register(handler: Callable[..., Any]) -> Callable[..., Any]:
            self.add(template, handler)
            return handler

        return register

    def match(self, path: str) -> tuple[Callable[..., Any], dict[str, Any]]:
        for route in self.routes:
            found = route.pattern.regex.match(path)
            if found:
                return route.handler, route.pattern.convert(found.groupdict())
        raise NotFound(path)

    def dispatch(self, path: str) -> Any:
        handler, params = self.match(path)
        return handler(**params)
