"""Training on harness traces on small machines: a frozen shared prefix for SFT and GRPO
(`frozen_prefix`), the evaluation statistics (`evaluation`)."""

from __future__ import annotations

from .frozen_prefix import FrozenPrefixScorer

__all__ = ["FrozenPrefixScorer"]
