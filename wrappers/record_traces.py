"""Stream every finished episode (trace and metadata) to one file per run."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from gymnasium.vector import VectorEnv, VectorWrapper

from ..trace import SEGMENT_SCHEMA, normalize_segment

_ARROW_TYPES = {
    "str": pa.string(), "str?": pa.string(), "bool": pa.bool_(), "int": pa.int64(),
    "int?": pa.int64(),
    "list[int]": pa.list_(pa.int64()), "list[int8]": pa.list_(pa.int8()),
    "list[float]": pa.list_(pa.float64()),
    "list[int?]": pa.list_(pa.int64()), "list[float?]": pa.list_(pa.float64()),  # null items
}
#: A trace segment as Parquet stores it: `harness_gym.trace.SEGMENT_SCHEMA`, field for field.
SEGMENT = pa.struct([(name, _ARROW_TYPES[kind]) for name, kind in SEGMENT_SCHEMA.items()])

# One row per episode. Columns never change with the wrappers present: flags a wrapper did not
# set are null, so files from different runs concatenate.
SCHEMA = pa.schema([
    ("run_id", pa.string()),
    ("step", pa.int64()),
    ("env_index", pa.int64()),
    ("task_id", pa.string()),
    ("harness", pa.string()),
    ("outcome", pa.string()),
    ("reward", pa.float64()),
    ("n_llm_calls", pa.int64()),
    ("n_tool_calls", pa.int64()),
    ("policy_version_min", pa.int64()),
    ("policy_version_max", pa.int64()),
    ("duration_s", pa.float64()),
    ("error", pa.string()),
    ("patch", pa.string()),
    ("tests", pa.string()),  # JSON: {test id: status}
    ("reward_breakdown", pa.string()),  # JSON
    ("advantage", pa.float64()),
    ("stale", pa.bool_()),
    ("drop", pa.bool_()),
    ("model", pa.string()),
    ("tokenizer", pa.string()),
    ("trace", pa.list_(SEGMENT)),
])

_FLAGS = ("advantage", "stale", "drop")


class RecordTraces(VectorWrapper):
    """Writes one row per finished episode to `path/<run_id>.<format>` (see `SCHEMA`).

    JSON Lines rows are flushed as each step ends; Parquet rows go out as one row group per step
    with the fixed `SCHEMA`, and the file is complete once the wrapper closes. Wrap it outside
    `GroupRelativeAdvantage` / `StalenessFilter` to record their columns too. `record()` writes
    episodes that did not come from `step()` the same way (each as it finishes, say).

    On a vector env (run in tests/test_wrappers.py)::

        envs = RecordTraces(vec_env, "runs/", format="parquet")
        _ = envs.reset(seed=0); _ = envs.step(None); envs.close()
        pq.read_table(envs.file).column("task_id").to_pylist()
        # ['harness-gym__tabular-9', 'harness-gym__tabular-9', ...]
    """

    def __init__(
        self, env: VectorEnv, path: str | os.PathLike[str],
        format: Literal["jsonl", "parquet"] = "jsonl",
    ) -> None:
        super().__init__(env)
        if format not in ("jsonl", "parquet"):
            raise ValueError(f"format must be 'jsonl' or 'parquet', got {format!r}")
        self.format = format
        self.run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"
        directory = Path(path)
        directory.mkdir(parents=True, exist_ok=True)
        self.file = directory / f"{self.run_id}.{format}"
        self._steps = 0
        # Held open for the wrapper's life (closed in close()), so rows stream as steps end.
        self._jsonl = (open(self.file, "w", encoding="utf-8")  # noqa: SIM115
                       if format == "jsonl" else None)
        self._parquet = pq.ParquetWriter(self.file, SCHEMA) if format == "parquet" else None

    def step(self, actions: Any):
        obs, rewards, terminations, truncations, infos = self.env.step(actions)
        self.record(rewards, infos)
        return obs, rewards, terminations, truncations, infos

    def record(self, rewards: Sequence[float] | np.ndarray, infos: dict[str, Any]) -> None:
        """Write one row per episode of a batch (`infos` batched as `step()` returns them, e.g.
        by `harness_gym.vector_env.batch_infos`), as one `step`. For episodes run outside
        `step()` (`HarnessVectorEnv.run_continuously`): wrappers inside this one never saw them,
        so their flag columns are null; an info's `env_index` is kept where it has one."""
        if self._jsonl is None and self._parquet is None:
            raise RuntimeError(f"RecordTraces for {self.file} is closed: nothing more is written")
        rows = [self._row(i, len(rewards), float(rewards[i]), infos) for i in range(len(rewards))]
        if self._jsonl is not None:
            self._jsonl.writelines(json.dumps(row) + "\n" for row in rows)
            self._jsonl.flush()
        else:
            self._parquet.write_table(pa.Table.from_pylist(rows, schema=SCHEMA))
        self._steps += 1

    def close(self, **kwargs: Any) -> None:
        try:
            self.env.close(**kwargs)
        finally:
            if self._jsonl is not None:
                self._jsonl.close()
                self._jsonl = None
            if self._parquet is not None:
                self._parquet.close()
                self._parquet = None

    def _row(self, i: int, n: int, reward: float, infos: dict[str, Any]) -> dict[str, Any]:
        def get(key: str, source: dict[str, Any] = infos) -> Any:
            if key not in source or not source.get(f"_{key}", np.ones(n, bool))[i]:
                return None
            value = source[key][i]
            return value.item() if isinstance(value, np.generic) else value

        breakdown = infos.get("reward_breakdown", {})
        env_index = get("env_index")
        row = {
            "run_id": self.run_id, "step": self._steps, "reward": reward,
            "env_index": i if env_index is None else env_index,
            "tests": json.dumps(get("tests")),
            "reward_breakdown": json.dumps({k: get(k, breakdown) for k in breakdown
                                            if not k.startswith("_")}),
            "trace": [normalize_segment(segment) for segment in get("trace") or []],
        }
        for name in SCHEMA.names:
            if name not in row:
                row[name] = get(name)
        return row
