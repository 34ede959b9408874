"""The test-gated reward table: what each outcome scores, and that a pass always wins."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness_gym.rewards import OUTCOMES, RewardConfig

# The values rewards.py documents for the default config.
TABLE = [
    ("passed", 0, 1.0),
    ("passed", 5, 0.95),
    ("passed", 50, 0.5),  # 1 - 0.01 * 50 = 0.5: the floor
    ("failed", 0, 0.0),
    ("failed", 50, 0.0),  # no tool penalty without a pass
    ("timeout", 3, 0.0),
    ("harness_error", 3, 0.0),
    ("infra_error", 0, 0.0),
]


@pytest.mark.parametrize(("outcome", "n_tool_calls", "expected"), TABLE)
def test_each_outcome_scores_its_documented_value(outcome, n_tool_calls, expected):
    reward, breakdown = RewardConfig()(outcome, n_tool_calls)
    assert reward == pytest.approx(expected)
    assert breakdown["outcome"] == outcome and breakdown["n_tool_calls"] == n_tool_calls
    assert breakdown["base"] - breakdown["tool_penalty"] == pytest.approx(reward)
    assert breakdown["drop"] == (outcome == "infra_error")


def test_a_pass_far_past_the_penalty_budget_stops_at_the_floor():
    assert RewardConfig()("passed", 10_000)[0] == 0.5


def test_configured_failure_values_are_used():
    config = RewardConfig(failure=-0.5, timeout=-1.0, harness_error=-0.75, infra_error=-0.25)
    assert [config(o, 2)[0] for o in ("failed", "timeout", "harness_error", "infra_error")] == \
        [-0.5, -1.0, -0.75, -0.25]
    assert config("infra_error", 0)[1]["drop"] is False


def test_a_config_where_a_failure_could_match_a_pass_is_refused():
    with pytest.raises(ValueError, match="must be below pass_floor"):
        RewardConfig(timeout=0.5, pass_floor=0.5)
    with pytest.raises(ValueError, match="unknown outcome"):
        RewardConfig()("crashed", 0)


configs = st.builds(
    RewardConfig,
    success=st.floats(0.6, 10),
    failure=st.floats(-10, 0.4),
    tool_penalty=st.floats(0, 1),
    pass_floor=st.just(0.5),
    timeout=st.none() | st.floats(-10, 0.4),
    harness_error=st.none() | st.floats(-10, 0.4),
    infra_error=st.just("drop") | st.floats(-10, 0.4),
)


@settings(deadline=None)  # a loaded machine's pause is not a failure
@given(config=configs, pass_tools=st.integers(0, 10_000), fail_tools=st.integers(0, 10_000))
def test_every_pass_scores_above_every_failure_whatever_the_tool_counts(config, pass_tools,
                                                                       fail_tools):
    passed = config("passed", pass_tools)[0]
    for outcome in OUTCOMES[1:]:
        assert passed > config(outcome, fail_tools)[0]


# The flat penalty is the trap issue 26 measures: kept only to show why the gate exists.
FLAT_TABLE = [
    ("passed", 0, 1.0),
    ("passed", 5, 0.95),
    ("passed", 80, pytest.approx(0.2)),  # no floor
    ("failed", 0, 0.0),
    ("failed", 5, -0.05),  # paid even though the tests failed
    ("timeout", 10, -0.1),
    ("infra_error", 7, 0.0),  # still dropped, never penalised
]


@pytest.mark.parametrize(("outcome", "n_tool_calls", "expected"), FLAT_TABLE)
def test_the_flat_penalty_charges_tool_calls_whatever_the_outcome(outcome, n_tool_calls,
                                                                   expected):
    reward, breakdown = RewardConfig(penalty="flat")(outcome, n_tool_calls)
    assert reward == expected
    assert breakdown["penalty"] == "flat"
    assert breakdown["base"] - breakdown["tool_penalty"] == pytest.approx(reward)


def test_under_the_flat_penalty_quitting_beats_trying_and_failing_which_the_gate_prevents():
    flat, gated = RewardConfig(penalty="flat"), RewardConfig()
    assert flat("failed", 0)[0] > flat("failed", 12)[0]  # the trap: doing nothing pays
    assert gated("failed", 0)[0] == gated("failed", 12)[0]  # gated: effort costs nothing
    assert flat("passed", 60)[0] < gated("passed", 60)[0]  # and no floor for a long pass


def test_an_unknown_penalty_mode_is_refused():
    with pytest.raises(ValueError, match="penalty is 'gated'"):
        RewardConfig(penalty="linear")
