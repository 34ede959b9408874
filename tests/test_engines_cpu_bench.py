"""`benchmarks/engines_cpu.py` without running it: the cells interleave fairly, the summary's
ratios come from the cells, and README's engines table is the one the committed results give.
(`tests/test_real_vllm.py` runs its `--quick` mode against a real server.)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import engines_cpu  # noqa: E402


def test_each_round_runs_every_level_on_both_engines_in_alternating_order():
    order = engines_cpu.schedule([1, 4, 8], 2)
    assert len(order) == 12
    for r in (0, 1):
        cells = [(n, e) for rr, n, e in order if rr == r]
        assert sorted(cells) == sorted((n, e) for n in (1, 4, 8) for e in engines_cpu.ENGINES)
    firsts = [order[i][2] for i in range(0, 12, 2)]  # who goes first in each pair of cells
    assert firsts.count("inprocess") == firsts.count("vllm") == 3
    assert [n for r, n, _ in order if r == 1][::2] == [8, 4, 1]  # round 2 reversed


def cell(engine: str, n: int, tokens: int, wall: float, ttfts: list[float]) -> dict:
    return {"engine": engine, "concurrency": n, "tokens": tokens, "wall_s": wall,
            "episodes": n, "ttfts_s": ttfts, "model_calls": len(ttfts),
            "loadavg_start": [2.0, 0, 0], "loadavg_end": [4.0, 0, 0]}


def test_the_summary_pools_the_rounds_and_divides_vllm_by_in_process():
    cells = [cell("inprocess", 4, 100, 10.0, [1.0, 3.0]), cell("inprocess", 4, 100, 30.0, [2.0]),
             cell("vllm", 4, 300, 20.0, [0.5, 0.5, 1.5])]
    row = engines_cpu.summarize(cells, [4])["4"]
    assert row["inprocess"]["tokens_per_s"] == 5.0  # 200 tokens over 40 s, not a mean of rates
    assert row["inprocess"]["episodes_per_h"] == 720.0 and row["inprocess"]["ttft_p50_s"] == 2.0
    assert row["vllm"]["tokens_per_s"] == 15.0 and row["vllm"]["loadavg_1min_mean"] == 3.0
    assert row["ratio_vllm_over_inprocess"] == {"tokens_per_s": 3.0, "episodes_per_h": 1.0,
                                                "ttft_p50": 0.25}


def test_the_readme_table_is_the_committed_results():
    results = json.loads(engines_cpu.RESULTS.read_text())
    readme = (REPO / "README.md").read_text()
    begin = readme.index(engines_cpu.README_BEGIN)
    end = readme.index(engines_cpu.README_END, begin) + len(engines_cpu.README_END)
    assert readme[begin:end] == engines_cpu.readme_block(results), \
        "regenerate: python benchmarks/engines_cpu.py --readme"
