"""Mining tasks from real code: bugs injected into a real PyPI package (inflection 0.5.1, pure
Python, its pytest suite in the sdist) and a git history made here (a bug fix with a new test
is kept; a refactor without tests and a commit whose tests already passed are not). Every kept
task is validated in the default sandbox; then Pi with the oracle solves mined tasks through
`gym.make` and `oracle:noop` fails them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
from dataclasses import replace
from pathlib import Path

import gymnasium as gym
import pytest
from harness_gym.sandbox import default_sandbox, load_sandbox
from harness_gym.sandbox.docker import docker_unavailable
from harness_gym.tasks import TaskError, load_tasks
from harness_gym.tasks.mine import make_tasks
from harness_gym.tasks.mine.candidate import leak_fragments, leaks, scrub
from harness_gym.tasks.mine.envs import env_mounts
from harness_gym.tasks.mine.mutate import KINDS, mutants
from harness_gym.tasks.mine.pypi import SdistError, parse_pin
from harness_gym.tasks.mine.runs import failure_excerpt

import harness_gym  # noqa: F401  (registers HarnessSWE-v0)
from harness_gym.cli import main as cli_main
from support.parallel import in_threads

PACKAGE = "inflection==0.5.1"


@pytest.fixture(scope="module")
def pypi_tasks(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("mined-pypi")
    try:
        summary = make_tasks(pypi=PACKAGE, n=2, out=out, progress=False)
    except SdistError as error:
        pytest.skip(f"the registry is not reachable: {error}")
    assert summary.kept == 2, summary
    return out


def _commit(repo: Path, message: str, files: dict[str, str]) -> None:
    for path, text in files.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(textwrap.dedent(text))
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_GLOBAL": os.devnull}
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True, env=env)
    subprocess.run(["git", "commit", "-qm", message], cwd=repo, check=True, env=env)


CALC = """\
    def clamp(value, low, high):
        return max(low, min(value, high))


    def mean(values):
        return sum(values) / len(values)
    """
CALC_TESTS = """\
    from calc.core import clamp, mean


    def test_clamp_inside():
        assert clamp(5, 0, 10) == 5


    def test_mean():
        assert mean([1, 2, 3]) == 2
    """


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("history") / "calc"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=repo, check=True)
    _commit(repo, "calc: clamp and mean", {"calc/__init__.py": "", "calc/core.py": CALC,
                                           "tests/test_calc.py": CALC_TESTS})
    _commit(repo, "mean of nothing is 0, not ZeroDivisionError\n\nmean([]) raised.", {
        "calc/core.py": CALC.replace("    return sum(values) / len(values)",
                                     "    return sum(values) / len(values) if values else 0"),
        "tests/test_calc.py": CALC_TESTS + "\n\n    def test_mean_of_nothing():\n"
                                           "        assert mean([]) == 0\n"})
    _commit(repo, "refactor: name the bounds", {
        "calc/core.py": (repo / "calc/core.py").read_text().replace("low, high", "lo, hi")
                                                          .replace("value, high", "value, hi")
                                                          .replace("max(low", "max(lo")})
    _commit(repo, "clamp docs, a test that always passed", {
        "calc/core.py": (repo / "calc/core.py").read_text().replace(
            "def clamp(value, lo, hi):\n", 'def clamp(value, lo, hi):\n    """Bound value."""\n'),
        "tests/test_calc.py": (repo / "tests/test_calc.py").read_text()
        + "\n\ndef test_clamp_above():\n    assert clamp(50, 0, 10) == 10\n"})
    return repo


def test_a_pin_is_required_and_a_bad_one_is_refused_in_one_line(tmp_path, capsys):
    with pytest.raises(SdistError, match="NAME==VERSION"):
        parse_pin("inflection>=0.5")
    assert cli_main(["tasks", "make", "--pypi", "inflection", "--n", "1", "--out",
                     str(tmp_path)]) == 2
    assert "NAME==VERSION" in capsys.readouterr().err


def test_a_directory_that_is_not_a_repository_is_refused_in_one_line(tmp_path, capsys):
    assert cli_main(["tasks", "make", "--git", str(tmp_path), "--n", "1", "--out",
                     str(tmp_path / "out"), "--quiet"]) == 2
    assert "is not a git repository" in capsys.readouterr().err


def test_the_failure_excerpt_never_shows_a_line_of_the_fix():
    output = textwrap.dedent("""\
        ___________________________ test_total ___________________________
        tests/test_t.py:3: in test_total
            assert total([1, 2]) == 3
        src/t.py:2: in total
            return sum(values) - 1
        E   assert 2 == 3
        E    +  where 2 = total([1, 2])
        E   in: return sum(values) - 1
        """)
    excerpt = failure_excerpt(output, "tests/test_t.py::test_total",
                              hide=("return sum(values) - 1", "return sum(values)"))
    assert excerpt == "E   assert 2 == 3\nE    +  where 2 = total([1, 2])"


FIX = """\
diff --git a/src/t.py b/src/t.py
--- a/src/t.py
+++ b/src/t.py
@@ -1,4 +1,4 @@
 def total(values, start=0):
-    for i in range(len(values) - 1):
+    for i in range(len(values)):
         start += values[i]
-    return max(start, limit)
+    return max(limit, start)
"""


def test_a_statement_never_shows_the_fix_or_the_mutated_token():
    # Adversarial: the library's own error message and the commit message quote the code.
    assert {"range(len(values) - 1):", "max(limit, start)", "max(start, limit)"} <= set(
        leak_fragments(FIX))
    output = textwrap.dedent("""\
        ___________________________ test_total ___________________________
        E   ValueError: bad loop: for i in range(len(values)):
        E   AssertionError: expected max(limit, start) to hold
        E   assert 3 == 6
        E   assert None == 'x'
        """)
    excerpt = failure_excerpt(output, "tests/test_t.py::test_total",
                              hide=tuple(leak_fragments(FIX)))
    assert excerpt == "E   assert 3 == 6\nE   assert None == 'x'"  # behaviour stays
    message = "total: sum every value\n\nUse `range(len(values))` and max(limit, start).\nFixes #3."
    assert scrub(message, FIX) == "total: sum every value\n\nFixes #3."
    assert leaks("see max(start, limit) there", FIX) == ["max(start, limit)"]
    # a changelog in the patch is not code: quoting it is what a release statement does
    changelog = FIX + ("diff --git a/CHANGES.rst b/CHANGES.rst\n--- a/CHANGES.rst\n"
                       "+++ b/CHANGES.rst\n@@ -0,0 +1 @@\n+- total() sums the last value too\n")
    assert leaks("- total() sums the last value too", changelog) == []


def test_every_mutant_parses_and_changes_one_site_outside_docstrings():
    source = textwrap.dedent('''\
        def window(items, size=2):
            """Docstring: 1 < 2 and True."""
            if size <= 0:
                raise ValueError("size")
            out = []
            for i in range(len(items) - size + 1):
                out.append(items[i:i + size])
            return out
        ''')
    found = mutants("w.py", source)
    assert {m.kind for m in found} >= {"comparison", "off_by_one", "operator", "drop_statement",
                                       "drop_branch", "return_none"}
    assert {m.kind for m in found} <= set(KINDS)
    for mutant in found:
        compile(mutant.source, "w.py", "exec")
        assert '"""Docstring: 1 < 2 and True."""' in mutant.source
        before, after = source.splitlines(), mutant.source.splitlines()
        assert len([a for a, b in zip(before, after) if a != b]) <= 1 or len(after) < len(before)


def test_mined_pypi_tasks_are_valid_with_symptom_statements_and_a_split(pypi_tasks):
    tasks = load_tasks(pypi_tasks)
    assert len(tasks) == 2
    split = json.loads((pypi_tasks / "split.json").read_text())
    assert sorted(split["train"] + split["heldout"] + split["mixed"]) == sorted(
        t.instance_id for t in tasks)
    summary = json.loads((pypi_tasks / "mining.json").read_text())
    assert summary["kept"] == 2 and summary["candidates"] > 50
    for task in tasks:
        meta = task.extra["mine"]
        assert task.FAIL_TO_PASS and task.PASS_TO_PASS and task.test_patch == ""
        assert meta["kind"] in KINDS and meta["difficulty"]["level"] in ("easy", "medium", "hard")
        assert leaks(task.problem_statement, task.patch) == []  # never the changed line or token
        assert task.FAIL_TO_PASS[0] in task.problem_statement
        # held-out code is never trained on: a held-out unit holds no training task
        if meta["split"] == "train":
            assert not set(meta["units"]) & set(split["heldout_units"])


def test_a_second_run_resumes_without_running_anything(pypi_tasks, capsys):
    summary = make_tasks(pypi=PACKAGE, n=2, out=pypi_tasks, progress=False)
    assert (summary.kept, summary.resumed, summary.tried) == (2, 2, 0)
    # the command: a progress bar on stderr, the summary with rejections by reason on stdout
    assert cli_main(["tasks", "make", "--pypi", PACKAGE, "--n", "2", "--out",
                     str(pypi_tasks)]) == 0
    said = capsys.readouterr()
    assert f"mining {PACKAGE}" in said.err and "2/2" in said.err
    assert "kept (2 already written); rejected: none; split:" in said.out


def test_the_same_fix_made_twice_in_a_history_is_one_task(history, tmp_path):
    repo = tmp_path / "calc"
    shutil.copytree(history, repo)
    fixed = (repo / "calc/core.py").read_text()
    tests = (repo / "tests/test_calc.py").read_text()
    broken = fixed.replace(" if values else 0", "")
    without = tests.replace("\n\ndef test_mean_of_nothing():\n    assert mean([]) == 0\n", "")
    assert broken != fixed and without != tests
    _commit(repo, "revert the empty mean", {"calc/core.py": broken, "tests/test_calc.py": without})
    _commit(repo, "mean of nothing is 0 again",
            {"calc/core.py": fixed, "tests/test_calc.py": tests})
    out = tmp_path / "mined"
    summary = make_tasks(git=repo, n=5, out=out, progress=False)
    assert summary.kept == 1 and summary.rejected["duplicate"] == 1, summary


def test_a_commit_whose_tests_kill_the_suite_before_it_is_rejected(history, tmp_path):
    # As cachetools 7.3.3's test did on 7.3.2 (a loop growing a list until the memory limit's
    # SIGKILL): no per-test report, so every test would have looked like a FAIL_TO_PASS.
    repo = _history_adding_double(history, tmp_path, """\
            import os
            import signal

            import calc.core

            if not hasattr(calc.core, "double"):
                os.kill(os.getpid(), signal.SIGKILL)


            def test_double():
                assert calc.core.double(2) == 4
            """)
    summary = make_tasks(git=repo, n=5, out=tmp_path / "mined", progress=False)
    assert summary.kept == 1 and summary.rejected == {"no_tests": 1, "no_fail_to_pass": 1,
                                                      "killed": 1}, summary


def test_a_commit_whose_new_tests_flip_a_coin_is_rejected_as_flaky(history, tmp_path):
    # As cachetools 7.1.7's RRCache test (random eviction), kept when each side ran once:
    # 16 coins, each run twice with the fix and twice without; all agreeing has odds of 4**-16.
    repo = _history_adding_double(history, tmp_path, """\
            import random

            import pytest

            import calc.core


            def test_double():
                assert calc.core.double(2) == 4


            @pytest.mark.parametrize("draw", range(16))
            def test_lucky_draw(draw):
                assert random.random() < 0.5
            """)
    summary = make_tasks(git=repo, n=5, out=tmp_path / "mined", progress=False)
    assert summary.kept == 1 and summary.rejected == {"no_tests": 1, "no_fail_to_pass": 1,
                                                      "flaky": 1}, summary
    (why,) = summary.problems.values()
    assert any("test_lucky_draw[" in problem and "flaky" in problem for problem in why), why


def test_a_task_naming_an_env_outside_the_cache_is_refused(pypi_tasks):
    (task,) = load_tasks(next(p for p in pypi_tasks.iterdir() if p.is_dir()))
    for bad in ("../../etc", "/", "mine-env-x/../../.."):
        hostile = replace(task, install_config={**task.install_config, "python_env": bad})
        with pytest.raises(TaskError, match="python_env"):
            env_mounts(hostile, load_sandbox(default_sandbox()))


def test_git_history_keeps_the_fix_with_its_new_test_and_rejects_the_rest(history, tmp_path,
                                                                          capsys):
    out = tmp_path / "mined"
    assert cli_main(["tasks", "make", "--git", str(history), "--n", "5", "--out", str(out),
                     "--quiet"]) == 0
    said = capsys.readouterr().out
    (task,) = load_tasks(out)
    summary = json.loads((out / "mining.json").read_text())
    assert summary["kept"] == 1 and summary["rejected"] == {"no_tests": 1, "no_fail_to_pass": 1}
    assert "3 candidates" in said
    assert task.FAIL_TO_PASS == ["tests/test_calc.py::test_mean_of_nothing"]
    assert set(task.PASS_TO_PASS) == {"tests/test_calc.py::test_clamp_inside",
                                      "tests/test_calc.py::test_mean"}
    assert task.problem_statement.startswith("mean of nothing is 0")
    assert "ZeroDivisionError" in task.problem_statement
    assert "calc/core.py" in task.patch and "tests/" not in task.patch
    assert "test_mean_of_nothing" in task.test_patch


@pytest.fixture(scope="module")
def git_tasks(history, tmp_path_factory) -> Path:
    """One task mined from the history, once for the module (it was mined per test)."""
    out = tmp_path_factory.mktemp("mined-git")
    make_tasks(git=history, n=1, out=out, progress=False)
    return out


def run_each(directories: dict[str, Path], **make) -> dict[str, tuple[float, dict]]:
    """kind -> (reward, info) of one Pi episode on the first task of each directory: the envs
    made one after the other, their episodes side by side (`support.parallel`)."""
    envs = {}
    try:
        for kind, directory in directories.items():
            task = load_tasks(directory)[0]
            envs[kind] = gym.make("HarnessSWE-v0", tasks=str(directory), harness="pi", **make)
            envs[kind].reset(options={"task_id": task.instance_id})
        steps = in_threads(lambda share: [env.step({}) for env in share],
                           list(envs.values()), workers=len(envs))
    finally:
        for env in envs.values():
            env.close()
    return {kind: (reward, info) for kind, (_, reward, _, _, info) in zip(envs, steps)}


MEDIAN = """\
    def median(values):
        ordered = sorted(values)
        return ordered[len(ordered) // 2]
    """
MEDIAN_EVEN = """\
    def median(values):
        ordered = sorted(values)
        middle = len(ordered) // 2
        if len(ordered) % 2:
            return ordered[middle]
        return (ordered[middle - 1] + ordered[middle]) / 2
    """
MEDIAN_TESTS = """\
    from stats.core import median


    def test_odd():
        assert median([3, 1, 2]) == 2
    """


def _history_adding_double(history: Path, tmp_path: Path, test_double: str) -> Path:
    """A copy of `history` with one more commit: `calc.core.double` and `test_double`'s text."""
    repo = tmp_path / "calc"
    shutil.copytree(history, repo)
    _commit(repo, "calc: double", {
        "calc/core.py": (repo / "calc/core.py").read_text() + "\n\ndef double(x):\n"
                                                              "    return 2 * x\n",
        "tests/test_double.py": test_double})
    return repo


def _stats_repo(root: Path) -> Path:
    """A second project with one fix: the median of an even count is the mean of the middle."""
    repo = root / "stats"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=repo, check=True)
    _commit(repo, "stats: median", {"stats/__init__.py": "", "stats/core.py": MEDIAN,
                                    "tests/test_stats.py": MEDIAN_TESTS})
    _commit(repo, "median of an even count is the mean of the two middle values", {
        "stats/core.py": MEDIAN_EVEN,
        "tests/test_stats.py": MEDIAN_TESTS + "\n\n    def test_even():\n"
                                              "        assert median([4, 1, 3, 2]) == 2.5\n"})
    return repo


def test_several_repositories_are_mined_into_one_directory_in_turn(history, tmp_path, capsys):
    calc = tmp_path / "calc"  # two fixes: mined alone with --n 2, both tasks would be calc's
    shutil.copytree(history, calc)
    core = (calc / "calc/core.py").read_text()
    _commit(calc, "clamp refuses an empty range", {
        "calc/core.py": core.replace("    return max(lo", "    if lo > hi:\n"
                                     "        raise ValueError('empty range')\n    return max(lo"),
        "tests/test_calc.py": (calc / "tests/test_calc.py").read_text()
        + "\n\ndef test_clamp_empty_range():\n    import pytest\n\n"
          "    with pytest.raises(ValueError):\n        clamp(1, 5, 0)\n"})
    stats = _stats_repo(tmp_path)
    out = tmp_path / "suite"
    assert cli_main(["tasks", "make", "--git", str(calc), str(stats), "--n", "2", "--out",
                     str(out), "--quiet"]) == 0
    assert "by repo: calc 1, stats 1" in capsys.readouterr().out
    tasks = {t.repo: t for t in load_tasks(out)}
    assert set(tasks) == {"calc", "stats"}
    assert tasks["calc"].FAIL_TO_PASS == ["tests/test_calc.py::test_mean_of_nothing"]
    assert tasks["stats"].FAIL_TO_PASS == ["tests/test_stats.py::test_even"]
    assert tasks["stats"].instance_id.startswith("stats__")
    summary = json.loads((out / "mining.json").read_text())
    # calc's three commits (one without tests) and stats' one; two tried, one from each
    assert (summary["candidates"], summary["tried"], summary["kept"]) == (5, 2, 2), summary
    assert summary["by_repo"] == {"calc": 1, "stats": 1}
    # split units name their repository: calc/core.py and stats/core.py are two files
    assert tasks["stats"].extra["mine"]["units"] == ["stats/stats/core.py::median"]
    # each task was validated with its own repository's environment
    envs = {t.install_config["python_env"] for t in tasks.values()}
    assert len(envs) == 2, envs


def test_two_repositories_of_one_name_or_since_with_several_are_refused(history, tmp_path,
                                                                        capsys):
    twin = tmp_path / "elsewhere" / "calc"
    shutil.copytree(history, twin)
    out = str(tmp_path / "out")
    assert cli_main(["tasks", "make", "--git", str(history), "--git", str(twin), "--n", "1",
                     "--out", out, "--quiet"]) == 2
    assert "share the name 'calc'" in capsys.readouterr().err
    stats = _stats_repo(tmp_path)
    assert cli_main(["tasks", "make", "--git", str(history), str(stats), "--since", "HEAD~1",
                     "--n", "1", "--out", out, "--quiet"]) == 2
    assert "--since names a revision of one repository" in capsys.readouterr().err
    assert not list((tmp_path / "out").glob("*/task.json"))


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("npm") is None, reason="Pi installs with npm")
@pytest.mark.parametrize("engine, outcome", [("oracle", "passed"), ("oracle:noop", "failed")])
def test_pi_solves_mined_tasks_with_the_oracle_and_noop_fails_them(pypi_tasks, git_tasks,
                                                                    engine, outcome):
    ran = run_each({"pypi": pypi_tasks, "git": git_tasks}, engine=engine)
    for kind, (reward, info) in ran.items():
        assert info["outcome"] == outcome, (kind, info["error"], info["grade"])
        assert (reward > 0) == (outcome == "passed")


TEACHER_CLIS = ["pi", "opencode", "claude-code", "hermes"]


@pytest.fixture(scope="module")
def teacher_demos(pypi_tasks) -> dict[str, dict]:
    """The teacher on one mined task through each CLI, all at once: one vector env with a
    sub-env per CLI (`mix_harnesses=True`), one proxy and one engine. One after the other they
    took ~60 s (Hermes alone ~27 s)."""
    if shutil.which("npm") is None:
        pytest.skip("the CLIs install with npm")
    task = load_tasks(pypi_tasks)[0]
    envs = gym.make_vec("HarnessSWE-v0", num_envs=len(TEACHER_CLIS), group_size=len(TEACHER_CLIS),
                        vectorization_mode="vector_entry_point", mix_harnesses=True,
                        harness=TEACHER_CLIS, tasks=str(pypi_tasks), engine="teacher",
                        episode_timeout_s=600, progress=False)
    try:
        envs.reset(options={"task_ids": [task.instance_id]})
        _, _, _, _, infos = envs.step(None)
    finally:
        envs.close()
    keys = ("outcome", "error", "grade", "n_tool_calls")
    return {harness: {key: infos[key][i] if key in infos else None for key in keys}
            for i, harness in enumerate(infos["harness"])}


@pytest.mark.slow
@pytest.mark.parametrize("harness", TEACHER_CLIS)
def test_the_teacher_demonstrates_a_mined_task_through_each_cli(teacher_demos, harness):
    # The teacher reads the files the gold patch changes and edits them with the CLI's own
    # tools: on a mined task it has no family metadata to lean on, only the patch and the repo.
    info = teacher_demos[harness]
    assert info["outcome"] == "passed", (harness, info["error"], info["grade"])
    assert info["n_tool_calls"] >= 2  # read, then edit: not the oracle's one blind patch


# --- docker: the tests run with a venv of the image's own Python --------------------------------

_NO_DOCKER = docker_unavailable()
needs_docker = pytest.mark.skipif(_NO_DOCKER is not None, reason=str(_NO_DOCKER))


@pytest.fixture(scope="module")
def docker_tasks(history, tmp_path_factory) -> dict[str, Path]:
    """One task from the registry package and one from the history, mined on docker."""
    out = {"pypi": tmp_path_factory.mktemp("docker-pypi"),
           "git": tmp_path_factory.mktemp("docker-git")}
    try:
        make_tasks(pypi=PACKAGE, n=1, out=out["pypi"], sandbox="docker", progress=False)
    except SdistError as error:
        pytest.skip(f"the registry is not reachable: {error}")
    make_tasks(git=history, n=1, out=out["git"], sandbox="docker", progress=False)
    return out


@needs_docker
def test_tasks_mined_on_docker_are_validated_there_with_the_images_python(docker_tasks):
    backend = load_sandbox("docker")
    try:
        for kind, directory in docker_tasks.items():
            (task,) = load_tasks(directory)  # validated on docker before it was written
            mounts = env_mounts(task, backend)
            (env,) = mounts
            built = json.loads((Path(env) / "harness-gym-env.json").read_text())
            assert built["runtime"] == "image" and built["image"] == "harness-gym/base:1", kind
            assert os.readlink(Path(env) / "bin" / "python3").startswith("/usr/bin/")
            # the same task on the host's sandbox: refused in one line, not a confusing failure
            with pytest.raises(TaskError, match="mined for docker image .* --sandbox bwrap"):
                env_mounts(task, load_sandbox("bwrap"))
    finally:
        backend.close()


@needs_docker
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("npm") is None, reason="Pi installs with npm")
@pytest.mark.parametrize("engine, outcome", [("oracle", "passed"), ("oracle:noop", "failed")])
def test_pi_on_docker_solves_mined_tasks_with_the_oracle_and_noop_fails_them(docker_tasks,
                                                                           engine, outcome):
    assert [len(load_tasks(d)) for d in docker_tasks.values()] == [1, 1]
    ran = run_each(docker_tasks, engine=engine, sandbox="docker", episode_timeout_s=300)
    for kind, (reward, info) in ran.items():
        assert info["outcome"] == outcome, (kind, info["error"], info["grade"])
        assert (reward > 0) == (outcome == "passed")
