"""`benchmarks/vllm_cpu_cores.py --quick` against real vllm-cpu servers (`tiny-vllm`): both
core splits run, each cell samples exactly the tokens it asked for (the work is fixed, so the
tokens/s compare like with like), and each configuration took effect as the kernel reports it:
vLLM's default binds its worker to fewer cores than this process may use, `all-cores` to all."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from support.real_vllm import REAL_VLLM

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import vllm_cpu_cores  # noqa: E402

pytestmark = REAL_VLLM


def cpus(allowed: str) -> set[int]:
    """A `Cpus_allowed_list` ("0-2,5") as a set."""
    found: set[int] = set()
    for part in allowed.split(","):
        low, _, high = part.partition("-")
        found.update(range(int(low), int(high or low) + 1))
    return found


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one core: nothing to split")
def test_the_quick_mode_measures_both_core_splits_on_fixed_work(tmp_path):
    out = tmp_path / "cores.json"
    assert vllm_cpu_cores.main(["--quick", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [r["config"] for r in result["runs"]] == ["reserved", "all-cores"]
    for run in result["runs"]:
        assert [c["n"] for c in run["cells"]] == result["levels"] == [1, 2]
        for cell in run["cells"]:
            assert cell["tokens"] == cell["n"] * result["max_tokens"]
            assert len(cell["ttft_s"]) == cell["n"] and cell["wall_s"] > 0
    mine = set(os.sched_getaffinity(0))
    reserved, all_cores = (set().union(*map(cpus, run["worker_thread_cpus"]))
                           for run in result["runs"])
    assert all_cores == mine  # OpenMP threads bound across every core
    assert reserved < mine  # vLLM's default keeps a core for its engine core
    for level in ("1", "2"):
        row = result["summary"][level]
        assert row["ratio_all_cores_over_reserved"] == pytest.approx(
            row["all-cores"]["tokens_per_s"] / row["reserved"]["tokens_per_s"], abs=1e-3)
