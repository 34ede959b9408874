"""The run's results file: every stage's figures, its time and the headline summary.

`ResultsWriter` is a part of `learning_curve.Pipeline`: `write_results` gathers each finished
stage's metrics into `learning_curve[_MODE].json` with its plot, the time spent (discarded
stages included) and, for the full preset, the plan from the calibration's per-unit times.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from .config import PRESETS, STAGES, wanted
from .plan import measured_units, plan, vllm_throughput
from .process import log
from .state import discarded, earlier_sittings
from .summary import headline_summary, paired_table, targets


class ResultsWriter:
    """The results file and plot of a `Pipeline`."""

    def plan(self, results: dict[str, Any]) -> dict[str, Any] | None:
        """The full preset's plan: from this run when it is the calibration (all its stages
        done), else from the committed calibration results."""
        calibration = results if self.config.mode == "calibrate" else None
        if calibration is None:
            path = self.results_dir / "learning_curve_calibrate.json"
            calibration = json.loads(path.read_text()) if path.exists() else None
        if calibration is None or self.config.mode == "quick":
            return None
        engines = self.results_dir / "engines_cpu.json"  # the server's throughput by level
        throughput = vllm_throughput(json.loads(engines.read_text())) if engines.exists() \
            else None
        try:
            return {"from": "learning_curve_calibrate.json",
                    **plan(PRESETS["full"], calibration, throughput)}
        except (KeyError, ZeroDivisionError, ValueError):
            # the calibration is not complete yet: the units it has measured
            return {"from": "learning_curve_calibrate.json", "complete": False,
                    "units_measured": measured_units(calibration)}

    @property
    def results_name(self) -> str:
        mode = self.config.mode
        return "learning_curve" if mode == "full" else f"learning_curve_{mode}"

    def write_results(self) -> dict[str, Any]:
        from harness_gym.training.report import plot_learning_curve, results_table

        finished = {s: m for s in STAGES if (m := self.done(s)) is not None}
        stages: dict[str, Any] = {"eval": {}}
        for stage, metrics in finished.items():
            if stage.startswith("eval-"):
                rest = {k: v for k, v in metrics.items() if k != "summary"}
                stages["eval"][stage[5:]] = {**metrics["summary"], **rest}
            else:
                stages[stage] = metrics
        results = {"mode": self.config.mode, "config": dataclasses.asdict(self.config),
                   "machine": {"cores": os.cpu_count()}, "stages": stages}
        # what this configuration runs and has not finished: a run still in progress says so
        pending = [s for s in wanted(list(STAGES), self.config) if s not in finished]
        results["stages_pending"] = pending
        results["times"] = {stage: {"wall_s": m["wall_s"], "cpu_s": m["cpu_s"]}
                            for stage, m in finished.items()}
        total = {k: sum(t[k] for t in results["times"].values()) for k in ("wall_s", "cpu_s")}
        # stages run and then removed (a changed configuration) spent the budget too, and so
        # did the cut sittings of a stage not finished yet
        results["discarded"] = discarded(self.workdir)
        thrown = sum(e["wall_s"] or 0.0 for e in results["discarded"])
        running = sum(s["wall_s"] for stage in pending
                      for s in earlier_sittings(self.stage_dir(stage)))
        results["times_total"] = {**total, "wall_h": round(total["wall_s"] / 3600, 2),
                                  "cpu_h": round(total["cpu_s"] / 3600, 2),
                                  "discarded_wall_s": thrown,
                                  "discarded_wall_h": round(thrown / 3600, 2),
                                  "unfinished_wall_s": running,
                                  "unfinished_wall_h": round(running / 3600, 2),
                                  "spent_wall_h": round((total["wall_s"] + thrown + running)
                                                        / 3600, 2)}
        calib = stages.get("train-pass")
        results["calibration"] = None if calib is None else {
            "sft_train_pass_at_temperature": calib["summary"]["pass_at_1"],
            "ci": calib["summary"]["pass_at_1_ci"], "zone": calib["zone"],
            "in_zone": calib["in_zone"], "by_kind": calib["pass_rate_by_kind"],
            "temperature": calib["temperature"], "episodes": calib["summary"]["n_episodes"]}
        results["summary"] = headline_summary(stages["eval"])
        results["paired"] = paired_table(stages["eval"])
        results["targets"] = targets(stages["eval"])
        results["plan"] = self.plan(results)
        if self.state is not None:  # what the committed state weighs, stage by stage
            sizes = self.state.bytes_by_stage()
            results["state"] = {"bytes_by_stage": sizes, "bytes_total": sum(sizes.values())}
        self.results_dir.mkdir(parents=True, exist_ok=True)
        name = self.results_name
        (self.results_dir / f"{name}.json").write_text(json.dumps(results, indent=1))
        if len(stages) > 1:  # a stage done: the plot says what there is (no stale one)
            plot_learning_curve(results, self.results_dir / f"{name}.png")
            log("\n" + results_table(results))
        return results

