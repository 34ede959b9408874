"""The test-gated reward: tests decide; tool calls only matter once the tests pass.

    reward = max(success - tool_penalty * n_tool_calls, pass_floor)   if outcome == "passed"
           = failure                                                  if outcome == "failed"
           = timeout            (failure when None)                   if outcome == "timeout"
           = harness_error      (failure when None)                   if outcome == "harness_error"
           = infra_error                                              if outcome == "infra_error"

`pass_floor` must lie above every non-pass value, so a pass always scores above any failure,
whatever its tool count.

`penalty="flat"` is the trap, kept for measuring it: every outcome but `infra_error` pays
`tool_penalty * n_tool_calls`, passed or not, and there is no floor. An episode that quits at once
(no tool call, tests failed) then scores above one that worked and failed, so a policy learns to
quit; it breaks invariant 6 on purpose and is never a default. `infra_error="drop"` scores 0.0 and flags the episode
(`info["reward_breakdown"]["drop"]`) so trainers leave it out: the model did nothing wrong.

    >>> RewardConfig()("passed", 5)[0]
    0.95
    >>> RewardConfig()("failed", 0)[0]
    0.0
    >>> RewardConfig(penalty="flat")("failed", 5)[0]
    -0.05
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Outcome = Literal["passed", "failed", "timeout", "harness_error", "infra_error"]
Penalty = Literal["gated", "flat"]
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
    penalty: Penalty = "gated"  # "flat": the quitting trap (module docstring), for experiments

    def __post_init__(self) -> None:
        if self.tool_penalty < 0:
            raise ValueError("tool_penalty must be >= 0")
        if self.penalty not in ("gated", "flat"):
            raise ValueError(f"penalty is 'gated' (the default) or 'flat', got {self.penalty!r}")
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
        cost = self.tool_penalty * n_tool_calls
        if outcome == "infra_error":
            drop = self.infra_error == "drop"
            base = reward = 0.0 if drop else float(self.infra_error)
        elif outcome == "passed":
            reward = (self.success - cost if self.penalty == "flat"
                      else max(self.success - cost, self.pass_floor))
        else:
            value = self.failure if outcome == "failed" else getattr(self, outcome)
            base = reward = self.failure if value is None else value
            if self.penalty == "flat":
                reward = base - cost
        breakdown = {
            "outcome": outcome,
            "base": base,
            "tool_penalty": base - reward,  # what the tool calls cost (gated: 0 unless passed)
            "n_tool_calls": n_tool_calls,
            "drop": drop,
            "penalty": self.penalty,
        }
        return float(reward), breakdown
