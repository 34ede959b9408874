"""Mining from a real history: inflection's own releases from the registry, one commit each,
messages from its changelog, mined with `--git`. (The second registry package, toolz 0.12.1
mined with `--pypi --n 20`, is measured by `benchmarks/mining.py` into
`benchmarks/results/mining_bwrap.json`: in the suite its mining alone passed the
600 s per-test limit.)"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import gymnasium as gym
import pytest
from harness_gym.tasks import load_tasks
from harness_gym.tasks.mine import make_tasks
from harness_gym.tasks.mine.candidate import leaks
from harness_gym.tasks.mine.pypi import SdistError
from harness_gym.tasks.mine.history import git
from harness_gym.tasks.mine.releases import registry_versions, release_history

import harness_gym  # noqa: F401  (registers HarnessSWE-v0)

RELEASES = ["0.2.1", "0.3.0", "0.3.1"]  # 0.3.0 adds tableize(), 0.3.1 fixes two plurals


@pytest.fixture(scope="module")
def releases_tasks(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("releases") / "inflection"
    try:
        release_history("inflection", RELEASES, repo)
    except SdistError as error:
        pytest.skip(f"the registry is not reachable: {error}")
    out = tmp_path_factory.mktemp("mined-releases")
    summary = make_tasks(git=repo, n=5, out=out, progress=False)
    assert summary.kept == 2, summary
    return out


def test_the_registry_lists_a_packages_final_releases_in_a_range_oldest_first():
    try:
        everything = registry_versions("inflection")
    except SdistError as error:
        pytest.skip(f"the registry is not reachable: {error}")
    assert everything[:5] == ["0.1.1", "0.1.2", "0.2.0", "0.2.1", "0.3.0"]
    assert registry_versions("inflection", since="0.2.1", until="0.3.1") == RELEASES
    with pytest.raises(SdistError, match="the registry lists no release of"):
        registry_versions("harness-gym-no-such-package-7f3c")


def test_a_release_pip_cannot_fetch_is_left_out_only_when_asked_and_named_by_the_next(tmp_path):
    versions = ["0.2.1", "0.2.99", "0.3.0"]  # 0.2.99 was never released
    with pytest.raises(SdistError):
        release_history("inflection", versions, tmp_path / "strict")
    repo = release_history("inflection", versions, tmp_path / "lenient", skip_missing=True)
    subjects = git(repo, "log", "--format=%s").splitlines()
    assert subjects == ["inflection 0.3.0 (also 0.2.99: no sdist pip can fetch)",
                        "inflection 0.2.1"]
    assert "def tableize" in (repo / "inflection.py").read_text()  # 0.3.0's code
    with pytest.raises(ValueError, match="at least two releases, inflection has 1"):
        release_history("inflection", ["0.2.99", "0.3.0"], tmp_path / "one", skip_missing=True)


def test_the_same_releases_make_the_same_commits_so_task_ids_hold(tmp_path):
    first = release_history("inflection", RELEASES, tmp_path / "first")
    time.sleep(1.1)  # a commit dated by the clock would differ now
    again = release_history("inflection", RELEASES, tmp_path / "again")
    assert git(first, "rev-parse", "HEAD") == git(again, "rev-parse", "HEAD")


def test_a_release_history_yields_its_real_fixes_with_the_changelog_as_statement(releases_tasks):
    tasks = {t.extra["mine"]["commit"]: t for t in load_tasks(releases_tasks)}
    by_release = {t.problem_statement.split("\n", 1)[0]: t for t in tasks.values()}
    assert set(by_release) == {"inflection 0.3.0", "inflection 0.3.1"}
    added = by_release["inflection 0.3.0"]
    assert "Added `tableize()` function." in added.problem_statement
    assert all("test_tableize" in test for test in added.FAIL_TO_PASS)
    fixed = by_release["inflection 0.3.1"]
    assert set(fixed.FAIL_TO_PASS) == {
        "test_inflection.py::test_pluralize_singular[human-humans]",
        "test_inflection.py::test_pluralize_singular[potato-potatoes]",
    }
    assert "'humen'" in fixed.problem_statement  # how the new test failed before the release
    for task in tasks.values():
        assert task.PASS_TO_PASS and "test_inflection.py" in task.test_patch
        assert "test_inflection.py" not in task.patch and "inflection.py" in task.patch
        assert leaks(task.problem_statement, task.patch) == []
        assert task.extra["mine"]["difficulty"]["level"] in ("easy", "medium", "hard")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("npm") is None, reason="Pi installs with npm")
@pytest.mark.parametrize("engine, outcome", [("oracle", "passed"), ("oracle:noop", "failed")])
def test_pi_solves_the_release_tasks_with_the_oracle_and_noop_fails_them(
        releases_tasks, engine, outcome):  # fmt: skip
    for directory in (releases_tasks,):
        task = load_tasks(directory)[0]
        env = gym.make("HarnessSWE-v0", tasks=str(directory), engine=engine, harness="pi")
        try:
            env.reset(options={"task_id": task.instance_id})
            _, reward, _, _, info = env.step({})
        finally:
            env.close()
        assert info["outcome"] == outcome, (task.instance_id, info["error"], info["grade"])
        assert (reward > 0) == (outcome == "passed")
