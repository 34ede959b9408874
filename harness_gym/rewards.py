"""The test-gated reward: tests decide; tool calls only matter once the tests pass.

    reward = max(success - tool_penalty * n_tool_calls, pass_floor)   if outcome == "passed"
           = failure                                                  if outcome == "failed"
           = timeout            (failure when None)                   if outcome == "timeout"
           = harness_error      (failure when None)                   if outcome == "harness_error"
           = infra_error                                              if outcome == "infra_error"

`pass_floor` must lie above every non-pass value, so a pass always scores above any failure,
whatever its tool count. `infra_error="drop"` scores 0.0 and flags the episode
(`info["reward_breakdown"]["drop"]`) so trainers leave it out: the model did nothing wrong.

    >>> RewardConfig()("passed", 5)[0]
    0.95
    >>> RewardConfig()("failed", 0)[0]
    0.0
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Outcome = Literal["passed", "failed", "timeout", "harness_error", "infra_error"]
OUTCOMES: tuple[str, ...] = ("passed", "failed", "timeout", "harness_error", "infra_error")


@dataclass(frozen=True)
class RewardConfig:
    success: float = 1.0
    failure: float = 0.0
    tool_penalty: float = 0.01
    pass_floor: float = 0.5
    timeout: float | None = None
    harness_error: float | None = None
    infra_error: float | Literal["drop"] = "drop"

    def __post_init__(self) -> None:
        if self.tool_penalty < 0:
            raise ValueError("tool_penalty must be >= 0")
        if self.pass_floor > self.success:
            raise ValueError("pass_floor must not exceed success")
        worst_pass = self.pass_floor
        others = {"failure": self.failure, "timeout": self.timeout,
                  "harness_error": self.harness_error,
                  "infra_error": None if self.infra_error == "drop" else self.infra_error}
        for name, value in others.items():
            if value is not None and value >= worst_pass:
                raise ValueError(
                    f"{name}={value} must be below pass_floor={worst_pass}: a pass must always "
                    "score above any failure"
                )

    @classmethod
    def coerce(cls, value: RewardConfig | dict[str, Any] | None) -> RewardConfig:
        if value is None:
            return cls()
        if isinstance(value, RewardConfig):
            return value
        if isinstance(value, dict):
            return cls(**value)
        raise TypeError(f"reward must be a RewardConfig or a dict of its fields, got {value!r}")

    def __call__(self, outcome: str, n_tool_calls: int) -> tuple[float, dict[str, Any]]:
        """(reward, breakdown) for an episode's outcome and the model's tool-call count."""
        if outcome not in OUTCOMES:
            raise ValueError(f"unknown outcome {outcome!r}; one of {OUTCOMES}")
        drop = False
        base = self.success
        if outcome == "passed":
            reward = max(self.success - self.tool_penalty * n_tool_calls, self.pass_floor)
        elif outcome == "infra_error":
            drop = self.infra_error == "drop"
            base = reward = 0.0 if drop else float(self.infra_error)
        else:
            value = self.failure if outcome == "failed" else getattr(self, outcome)
            base = reward = self.failure if value is None else value
        breakdown = {
            "outcome": outcome,
            "base": base,
            "tool_penalty": base - reward,  # what the tool calls cost (0 unless passed)
            "n_tool_calls": n_tool_calls,
            "drop": drop,
        }
        return float(reward), breakdown
