"""What a sandbox and the grader cost, side by side in one run.

Figures are best-of-N (the least disturbed by other load); grading rows interleave the direct
run and every backend so that load hits them alike.

1. Sandbox lifecycle: `create` (a materialized task repo copied in) + one `exec` of `true` +
   `close`, per installed backend (`local`, `bwrap`; `docker` when a daemon answers; any backend
   that cannot start here is listed as skipped, with why).
2. Grading: `grade()` of a gold-patched built-in task through each backend vs the same pytest
   command run directly, in a sandbox of the same backend whose checkout already holds the gold
   and test patches (the floor: what running the tests there costs with no grader at all). The
   hardened grader also captures the patch, restores the test scope, applies the test patch,
   runs pytest with its reporter plugin and tamper checks, and reads the report back: four
   sandbox commands (five with the base-commit probe) around the test run.

    python benchmarks/sandbox_overhead.py [--repeats 10] [--tasks 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness_gym.sandbox import available_sandboxes, load_sandbox  # noqa: E402
from harness_gym.sandbox.base import SandboxBackend, SandboxSpec  # noqa: E402
from harness_gym.tasks import Task, apply_patch, grade, load_tasks, materialize  # noqa: E402

# The sandboxes run the tasks' `python -m pytest`: this interpreter (it has pytest) goes first.
PATH_ENV = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


def best_ms(samples: list[float]) -> float:
    return min(samples) * 1000


def lifecycle(backend_name: str, task: Task, repeats: int) -> tuple[float, float, float]:
    """Best create, exec and close times (ms) for one backend."""
    backend = load_sandbox(backend_name)
    create, run, close = [], [], []
    try:
        for _ in range(repeats):
            with tempfile.TemporaryDirectory() as scratch:
                repo = Path(scratch) / "repo"
                materialize(task, repo)
                started = time.perf_counter()
                sandbox = backend.create(SandboxSpec(repo=repo, env=PATH_ENV, label="bench"))
                created = time.perf_counter()
                result = sandbox.exec("true")
                ran = time.perf_counter()
                sandbox.close()
                closed = time.perf_counter()
                if result.exit_code != 0:
                    raise RuntimeError(f"`true` exited {result.exit_code}: {result.stderr}")
                create.append(created - started)
                run.append(ran - created)
                close.append(closed - ran)
    finally:
        backend.close()
    return best_ms(create), best_ms(run), best_ms(close)


def direct_pytest_s(backend: SandboxBackend, task: Task) -> float:
    """The task's test command, run directly in a sandbox whose checkout holds both patches."""
    with tempfile.TemporaryDirectory() as scratch:
        repo = Path(scratch) / "repo"
        materialize(task, repo)
        for diff in (task.patch, task.test_patch):
            subprocess.run(["git", "apply", "-"], input=diff, text=True, cwd=repo, check=True)
        with backend.create(SandboxSpec(repo=repo, env=PATH_ENV, label="bench")) as box:
            started = time.perf_counter()
            result = box.exec(task.test_cmd, timeout=300)
            elapsed = time.perf_counter() - started
    if result.exit_code != 0:
        raise RuntimeError(f"{task.instance_id}: the tests failed directly: {result.stdout[-500:]}")
    return elapsed


def graded_s(backend: SandboxBackend, task: Task) -> tuple[float, float]:
    """`grade()` time and create + apply gold + grade + close time (s)."""
    with tempfile.TemporaryDirectory() as scratch:
        repo = Path(scratch) / "repo"
        materialize(task, repo)
        started = time.perf_counter()
        with backend.create(SandboxSpec(repo=repo, env=PATH_ENV, label="bench")) as box:
            apply_patch(box, task.patch, allow_fuzz=False)
            grade_started = time.perf_counter()
            result = grade(task, box, timeout_s=300)
            grading = time.perf_counter() - grade_started
        total = time.perf_counter() - started
    if result.outcome != "passed":
        raise RuntimeError(f"{task.instance_id} graded {result.outcome}: {result.error}")
    return grading, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--tasks", type=int, default=3, help="built-in tasks to grade")
    args = parser.parse_args()
    tasks = load_tasks("builtin")[: args.tasks]

    print(f"1. sandbox lifecycle, best of {args.repeats} (ms)")
    print(f"   {'backend':<8} {'create':>8} {'exec true':>10} {'close':>8} {'total':>8}")
    working: list[str] = []
    for name in available_sandboxes():
        try:
            create, run, close = lifecycle(name, tasks[0], args.repeats)
        except Exception as error:  # a backend that cannot start here: say why, move on
            print(f"   {name:<8} skipped: {type(error).__name__}: {str(error)[:100]}")
            continue
        working.append(name)
        total = create + run + close
        print(f"   {name:<8} {create:8.1f} {run:10.1f} {close:8.1f} {total:8.1f}")

    print(
        f"\n2. grading a gold-patched task vs its pytest command run directly in the same "
        f"backend, best of {args.repeats}, interleaved (s; ratio = grade / direct)"
    )
    header = f"   {'task':<26}"
    for name in working:
        header += f" | {name + ' direct':>13} {'grade':>6} {'ratio':>6}"
    print(header)
    backends = {name: load_sandbox(name) for name in working}
    ratios: dict[str, list[float]] = {name: [] for name in working}
    try:
        for task in tasks:
            # Interleaved and best-of: other load on the machine hits every column alike.
            direct: dict[str, list[float]] = {name: [] for name in working}
            graded: dict[str, list[float]] = {name: [] for name in working}
            failed: dict[str, str] = {}
            for _ in range(args.repeats):
                for name, backend in backends.items():
                    if name in failed:
                        continue
                    try:
                        direct[name].append(direct_pytest_s(backend, task))
                        graded[name].append(graded_s(backend, task)[0])
                    except Exception as error:
                        failed[name] = f"failed: {type(error).__name__}: {error}"[:60]
            row = f"   {task.instance_id:<26}"
            for name in working:
                if name in failed:
                    row += f" | {failed[name]:>27}"
                    continue
                ratio = min(graded[name]) / min(direct[name])
                ratios[name].append(ratio)
                row += f" | {min(direct[name]):13.3f} {min(graded[name]):6.3f} {ratio:6.2f}"
            print(row)
    finally:
        for backend in backends.values():
            backend.close()
    for name, values in ratios.items():
        if values:
            print(f"   {name}: grade() takes {statistics.median(values):.2f}x the bare test run")


if __name__ == "__main__":
    main()
