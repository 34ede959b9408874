"""The caps table in docs/reward-integrity.md is the committed measurement's, cell by cell, and
each measured row says what the env does there: it refuses exactly where a cap is missing, and
`allow_uncapped=True` then starts it (benchmarks/caps_matrix.py measures and renders)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import caps_matrix  # noqa: E402

RESULTS = json.loads(caps_matrix.RESULTS.read_text())
USERS = ("root", "non-root", "root, no writable cgroupfs")
ROWS = [(user, name, row) for user in USERS for name, row in RESULTS[user].items()
        if isinstance(row, dict) and "caps" in row]  # fmt: skip


def test_the_docs_table_is_rendered_from_the_results_file() -> None:
    text = caps_matrix.DOC.read_text()
    block = text.partition(caps_matrix.START)[2].partition(caps_matrix.END)[0].strip()
    assert block == caps_matrix.render(RESULTS)


def test_every_backend_and_user_was_measured() -> None:
    measured = {(user, name) for user, name, _ in ROWS}
    for name in ("bwrap", "local"):
        for user in ("root", "non-root", "root, no writable cgroupfs"):
            assert (user, name) in measured, (user, name)
    assert ("root", "docker") in measured


def test_the_env_refuses_exactly_where_a_cap_is_missing_and_opting_out_starts_it() -> None:
    for user, name, row in ROWS:
        missing = [cap for cap, how in row["caps"].items() if not how]
        assert row["missing"] == missing, (user, name, row)
        assert bool(row["refused"]) == bool(missing), (user, name, row)
        assert row["allow_uncapped"] == "starts", (user, name, row)


def test_where_every_cap_holds_the_attacks_stopped_at_it() -> None:
    limits, asked = RESULTS["limits"], RESULTS["asked"]
    for user, name, row in ROWS:
        if row["missing"]:
            continue
        assert row["forked"] < limits["pids"] < asked["forks"], (user, name, row)
        assert "1073741824" not in " ".join(row["memory"]), (user, name, row)
        assert int(row["disk"][-1]) <= limits["disk_mib"] * 2**20, (user, name, row)
        assert row["escapee"]["started"] >= 1 and row["escapee"]["left_after_kill"] == 0, row
        # A bomb holding the cap ends the turn with the reason; a 2 s burst does not.
        assert row["bomb"]["ended_s"] is not None and row["bomb"]["ended_s"] < 45, row
        assert "process cap of 64" in row["bomb"]["fault"], row
        assert row["bomb"]["burst_fault"] is None, row


def test_a_missing_process_cap_is_root_without_a_cgroup_only() -> None:
    for user, _, row in ROWS:
        assert (row["missing"] == ["pids"]) == (user == "root, no writable cgroupfs"), row
