"""Fixtures shared by the test modules."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness_gym.engines import Engine, load_engine


@pytest.fixture(scope="module")
def tiny() -> Iterator[Engine]:
    """The in-process tiny model (random weights, a real tokenizer): one per module."""
    engine = load_engine("tiny")
    yield engine
    engine.close()
