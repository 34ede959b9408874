"""SWE-rebench V2 / SWE-bench rows from JSONL and Parquet files."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from harness_gym.tasks import (
    Task,
    TaskError,
    load_tasks,
)

TASKS = {task.instance_id: task for task in load_tasks("builtin")}
SPANS = TASKS["harness-gym__spans-14"]  # test_patch modifies tests/test_merge.py
KVCONF = TASKS["harness-gym__kvconf-23"]  # test_patch creates tests/test_values.py
# Tasks built to misbehave: tests/fixtures/tasks/<id>/ (task.json + repo/, diffs made with git).
FIXTURES = {
    task.instance_id: task for task in load_tasks(Path(__file__).parent / "fixtures" / "tasks")
}
HANG = FIXTURES["fixture__hang-1"]  # the unfixed code loops forever on the F2P test
FLAKY = FIXTURES["fixture__flaky-2"]  # eight P2P tests pass by a coin flip
UNITTEST = FIXTURES["fixture__unittest-3"]  # python -m unittest -v, log_parser "unittest"
BADPATCH = FIXTURES["fixture__badpatch-4"]  # its gold patch is cut off mid-hunk
JUNIT = FIXTURES["fixture__junit-5"]  # junit_xml "auto": graded from a report outside the tree


# --- dataset rows -------------------------------------------------------------------------------


def _swe_rebench_row(instance_id: str, **overrides: object) -> dict[str, object]:
    row = {
        "instance_id": instance_id,
        "repo": "acme/widgets",
        "base_commit": "a" * 40,
        "problem_statement": "Widgets spin backwards",
        "patch": "diff --git a/w.py b/w.py\n",
        "test_patch": "diff --git a/tests/test_w.py b/tests/test_w.py\n",
        "FAIL_TO_PASS": json.dumps(["tests/test_w.py::test_spin"]),
        "PASS_TO_PASS": json.dumps(["tests/test_w.py::test_stop"]),
        "install_config": json.dumps(
            {
                "test_cmd": "pytest -rA",
                "log_parser": "parse_log_pytest",
                "install": "pip install -e .",
            }
        ),
        "image_name": "swerebench/sweb.eval.x86_64.acme_1776_widgets-1",
        "created_at": "2025-03-01T00:00:00Z",
    }
    row.update(overrides)
    return row


def test_a_jsonl_file_of_swe_rebench_rows_loads_with_json_encoded_fields(tmp_path: Path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        json.dumps(_swe_rebench_row("acme__widgets-1"))
        + "\n\n"
        + json.dumps(_swe_rebench_row("acme__widgets-2", FAIL_TO_PASS=["a::b"]))
        + "\n"
    )
    first, second = load_tasks(rows)
    assert first.FAIL_TO_PASS == ["tests/test_w.py::test_spin"]
    assert first.PASS_TO_PASS == ["tests/test_w.py::test_stop"]
    assert first.install_config["install"] == "pip install -e ."
    assert first.log_parser == "parse_log_pytest"
    assert first.image_name == "swerebench/sweb.eval.x86_64.acme_1776_widgets-1"
    assert first.base_commit == "a" * 40 and first.repo_dir is None
    assert first.extra == {"created_at": "2025-03-01T00:00:00Z"}
    assert second.FAIL_TO_PASS == ["a::b"]


def test_a_plain_swe_bench_row_needs_an_install_config_and_the_error_says_how(tmp_path: Path):
    row = _swe_rebench_row("django__django-1")
    del row["install_config"]
    rows = tmp_path / "swe_bench.jsonl"
    rows.write_text(json.dumps(row) + "\n")
    with pytest.raises(TaskError, match=r"(?s)swe_bench.jsonl:1: .*install_config=\{'test_cmd'"):
        load_tasks(rows)
    [task] = load_tasks(
        rows, install_config={"test_cmd": "./tests/runtests.py", "log_parser": "pytest"}
    )
    assert task.test_cmd == "./tests/runtests.py"


def test_make_takes_the_install_config_of_rows_that_lack_it(tmp_path: Path):
    import gymnasium as gym

    import harness_gym  # noqa: F401  (registers HarnessSWE-v0)

    row = _swe_rebench_row("django__django-1")
    del row["install_config"]
    rows = tmp_path / "swe_bench.jsonl"
    rows.write_text(json.dumps(row) + "\n")
    with pytest.raises(TaskError, match=r"install_config=\{'test_cmd'.* to gymnasium.make"):
        gym.make("HarnessSWE-v0", tasks=str(rows), engine="oracle")
    config = {"test_cmd": "./tests/runtests.py", "log_parser": "pytest"}
    env = gym.make("HarnessSWE-v0", tasks=str(rows), engine="oracle", install_config=config)
    envs = gym.make_vec("HarnessSWE-v0", num_envs=1, vectorization_mode="vector_entry_point",
                        tasks=rows, engine="oracle", install_config=config)
    for made in (env, envs):
        [task] = made.unwrapped.tasks
        assert task.test_cmd == "./tests/runtests.py" and task.log_parser == "pytest"
        made.close()


def test_a_bad_jsonl_line_is_reported_with_its_line_number(tmp_path: Path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(_swe_rebench_row("a-1")) + "\n{not json\n")
    with pytest.raises(TaskError, match=r"rows.jsonl:2: not valid JSON"):
        load_tasks(rows)
    rows.write_text(json.dumps(_swe_rebench_row("a-1", PASS_TO_PASS=5)) + "\n")
    with pytest.raises(TaskError, match=r"rows.jsonl:1: task 'a-1' is invalid:\n  - PASS_TO_PASS"):
        load_tasks(rows)


def test_a_task_round_trips_through_a_jsonl_row(tmp_path: Path):
    row_task = replace(SPANS, repo_dir=None)
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(row_task.to_dict()) + "\n")
    assert load_tasks(rows) == [row_task]
    assert isinstance(Task.from_dict(row_task.to_dict()), Task)


def test_parquet_files_of_rows_load_with_native_or_json_encoded_fields(tmp_path: Path):
    pyarrow = pytest.importorskip("pyarrow")
    parquet = pytest.importorskip("pyarrow.parquet")
    encoded = _swe_rebench_row("acme__widgets-1")
    native = _swe_rebench_row(
        "acme__widgets-2",
        FAIL_TO_PASS=["a::b"],
        PASS_TO_PASS=[],
        install_config={"test_cmd": "pytest -rA", "log_parser": "parse_log_pytest"},
    )
    parquet.write_table(pyarrow.Table.from_pylist([encoded]), tmp_path / "encoded.parquet")
    parquet.write_table(pyarrow.Table.from_pylist([native]), tmp_path / "native.parquet")
    [first] = load_tasks(tmp_path / "encoded.parquet")
    [second] = load_tasks(tmp_path / "native.parquet")
    assert first.FAIL_TO_PASS == ["tests/test_w.py::test_spin"]
    assert first.install_config["install"] == "pip install -e ."
    assert second.FAIL_TO_PASS == ["a::b"] and second.PASS_TO_PASS == []
    assert second.install_config == {"test_cmd": "pytest -rA", "log_parser": "parse_log_pytest"}
    assert first.image_name == second.image_name == encoded["image_name"]
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(TaskError, match="not a readable Parquet file"):
        load_tasks(tmp_path / "broken.parquet")
