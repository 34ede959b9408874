"""SWE-bench / SWE-rebench V2 rows end to end with the docker backend: the repo is already in the
row's image (at /testbed, at the row's base commit), nothing is copied in, and the grader works
on that checkout.

The row image is built here, locally (no registry is reachable): `harness-gym/base:1` plus one
built-in task's source tree committed at /testbed. It is kept between runs and rebuilt only
when that source tree changes (a label carries its hash).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import gymnasium as gym
import pytest
from harness_gym.tasks.git_hash import commit_hash
from harness_gym.tasks.loader import (
    BASE_COMMIT_IDENTITY,
    BUILD_LITTER,
    BUILTIN_SUITE_DIR,
    load_tasks,
)

from harness_gym.episode import EpisodeRunner
from harness_gym.config import EpisodeConfig
from harness_gym.harness import load_harness
from harness_gym.sandbox import SandboxError, SandboxSpec, load_sandbox
from harness_gym.sandbox.docker import DockerSandboxBackend, docker_unavailable

SOURCE_TASK = BUILTIN_SUITE_DIR / "harness-gym__routes-61"
ROW_IMAGE = "harness-gym/row-test:1"
SOURCE_LABEL = "harness-gym.row-test.source"

_NO_DOCKER = docker_unavailable()
needs_docker = pytest.mark.skipif(_NO_DOCKER is not None, reason=str(_NO_DOCKER))

# Committed with a fixed identity and date, so the image's commit depends only on the files.
DOCKERFILE = """\
FROM harness-gym/base:1
COPY repo /testbed
RUN cd /testbed \\
 && git init -q --initial-branch=main \\
 && printf '__pycache__\\n*.pyc\\n.pytest_cache\\n' > .git/info/exclude \\
 && git add --all \\
 && GIT_AUTHOR_NAME=row GIT_AUTHOR_EMAIL=row@harness-gym.invalid \\
    GIT_COMMITTER_NAME=row GIT_COMMITTER_EMAIL=row@harness-gym.invalid \\
    GIT_AUTHOR_DATE=2000-01-01T00:00:00Z GIT_COMMITTER_DATE=2000-01-01T00:00:00Z \\
    git commit -q -m base
"""


def _source_hash() -> str:
    return commit_hash(SOURCE_TASK / "repo", BASE_COMMIT_IDENTITY, BUILD_LITTER)


def _row_image(tmp: Path) -> str:
    """Build the row image unless an up-to-date one is present; its base commit."""
    import docker

    client = docker.from_env(timeout=300)
    try:
        source = _source_hash()
        try:
            image = client.images.get(ROW_IMAGE)
            fresh = (image.labels or {}).get(SOURCE_LABEL) == source
        except docker.errors.ImageNotFound:
            fresh = False
        if not fresh:
            context = tmp / "context"
            shutil.copytree(
                SOURCE_TASK / "repo",
                context / "repo",
                ignore=shutil.ignore_patterns(*BUILD_LITTER),
            )
            (context / "Dockerfile").write_text(DOCKERFILE)
            client.images.build(
                path=str(context),
                tag=ROW_IMAGE,
                labels={SOURCE_LABEL: source},
                rm=True,
                network_mode="none",
            )
        out = client.containers.run(
            ROW_IMAGE,
            ["git", "-C", "/testbed", "rev-parse", "HEAD"],
            remove=True,
            network_mode="none",
        )
        return out.decode().strip()
    finally:
        client.close()


@pytest.fixture(scope="module")
def row_jsonl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A JSONL file holding one SWE-rebench-V2-style row that runs in the row image."""
    if _NO_DOCKER is not None:
        pytest.skip(_NO_DOCKER)
    tmp = tmp_path_factory.mktemp("row")
    started = time.monotonic()
    base_commit = _row_image(tmp)
    print(
        f"row image ready in {time.monotonic() - started:.1f} s (base commit {base_commit})"
    )
    task = json.loads((SOURCE_TASK / "task.json").read_text())
    row = {
        "instance_id": "harness-gym__routes-61-row",
        "repo": task["repo"],
        "base_commit": base_commit,
        "problem_statement": task["problem_statement"],
        "patch": task["patch"],
        "test_patch": task["test_patch"],
        # Rows JSON-encode these, as the datasets ship them.
        "FAIL_TO_PASS": json.dumps(task["FAIL_TO_PASS"]),
        "PASS_TO_PASS": json.dumps(task["PASS_TO_PASS"]),
        "install_config": json.dumps(task["install_config"]),
        "image_name": ROW_IMAGE,
        "created_at": "2000-01-01T00:00:00Z",
    }
    path = tmp / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n")
    yield path


def _row(**changes: object) -> object:
    from harness_gym.tasks.task import Task

    task = json.loads((SOURCE_TASK / "task.json").read_text())
    return Task.from_dict({**task, "base_commit": "0" * 40, **changes})


# -- without docker: a row on a backend that cannot run its image -------------------------------


def _runner(backend: object) -> EpisodeRunner:
    # Never launched, no model called: the sandbox is refused first.
    harness = load_harness("pi")
    proxy = SimpleNamespace(engine=SimpleNamespace(model_name="unused", tokenizer_source=None,
                                                  max_context=32768))
    config = EpisodeConfig(harness=harness, engine="oracle", sandbox=backend,
                           episode_timeout_s=10, test_timeout_s=10)
    return EpisodeRunner(proxy, harness, backend, config)  # type: ignore[arg-type]


def test_a_row_on_a_local_sandbox_is_an_infra_error_that_names_docker() -> None:
    backend = load_sandbox("local")
    runner = _runner(backend)
    try:
        result = runner.run(_row(image_name="example/row:1"))  # type: ignore[arg-type]
        assert result.outcome == "infra_error"
        assert 'sandbox="docker"' in (result.error or ""), result.error
        assert "example/row:1" in (result.error or "")
        no_image = runner.run(_row())  # type: ignore[arg-type]
        assert no_image.outcome == "infra_error"
        assert "image_name" in (no_image.error or "") and 'sandbox="docker"' in (
            no_image.error or ""
        )
    finally:
        runner.close()
        backend.close()


def test_a_directory_task_still_copies_its_materialized_repo() -> None:
    backend = load_sandbox("local")
    runner = _runner(backend)
    try:
        task = load_tasks(str(BUILTIN_SUITE_DIR))[0]
        spec = runner.sandbox_spec(task)
        assert (
            spec.workdir is None
            and spec.repo is not None
            and (spec.repo / ".git").is_dir()
        )
    finally:
        runner.close()
        backend.close()


# -- with docker ---------------------------------------------------------------------------------


@needs_docker
def test_a_row_spec_uses_the_images_repo_where_it_lies(row_jsonl: Path) -> None:
    (task,) = load_tasks(row_jsonl)
    assert task.repo_dir is None and task.image_name == ROW_IMAGE
    backend = DockerSandboxBackend(memory="512m")
    runner = _runner(backend)
    try:
        spec = runner.sandbox_spec(task)
        assert (spec.repo, spec.image, spec.workdir) == (None, ROW_IMAGE, "/testbed")
        with backend.create(spec) as box:
            assert box.workdir == "/testbed"
            assert box.exec("pwd").stdout == "/testbed\n"
            assert box.exec("git rev-parse HEAD").stdout.strip() == task.base_commit
            assert box.exec("git status --porcelain").stdout == ""
            # HOME is the sandbox's own, fresh and empty, not the image's.
            assert box.exec('echo "$HOME"; ls -A "$HOME"').stdout == f"{box.home}\n"
            assert box.home.startswith(f"/sandbox/{box.id}/")
            # Relative paths are relative to the image's repo.
            box.write_file("probe.txt", "hi\n")
            assert box.read_file("/testbed/probe.txt") == b"hi\n"
            # git trusts the checkout whoever owns it (a row image's /testbed is often
            # another uid's), without any command-scope config.
            box.exec("chown -R 4242:4242 /testbed")
            status = box.exec("git status --porcelain")
            assert status.exit_code == 0 and status.stdout == "?? probe.txt\n", status
    finally:
        runner.close()
        backend.close()


@needs_docker
def test_a_spec_with_a_workdir_missing_from_the_image_is_refused(
    row_jsonl: Path,
) -> None:
    backend = DockerSandboxBackend(memory="512m")
    try:
        with pytest.raises(SandboxError, match="no repo at workdir '/nowhere'"):
            backend.create(SandboxSpec(image=ROW_IMAGE, workdir="/nowhere"))
        with pytest.raises(SandboxError, match="not both"):
            backend.create(
                SandboxSpec(repo=SOURCE_TASK / "repo", image=ROW_IMAGE, workdir="/x")
            )
    finally:
        backend.close()


def _episode(tasks: Path, engine: str) -> dict:
    env = gym.make(
        "HarnessSWE-v0",
        harness="pi",
        engine=engine,
        tasks=str(tasks),
        sandbox="docker",
        episode_timeout_s=300,
        test_timeout_s=300,
    )
    try:
        env.reset(seed=0)
        started = time.monotonic()
        _obs, reward, terminated, _truncated, info = env.step(None)
        print(
            f"{engine} episode on a row in docker: {info['outcome']} in"
            f" {time.monotonic() - started:.1f} s"
        )
        assert terminated
        return {**info, "reward": reward}
    finally:
        env.close()


@needs_docker
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    ("engine", "outcome"), [("oracle", "passed"), ("oracle:noop", "failed")]
)
def test_a_pi_episode_on_a_dataset_row_runs_in_the_rows_image(
    row_jsonl: Path, engine: str, outcome: str
) -> None:
    from harness_gym.harness import load_harness

    if not load_harness("pi").is_installed():
        pytest.skip("Pi is not installed in the harness cache (`harness-gym harnesses --install`)")
    info = _episode(row_jsonl, engine)
    assert info["outcome"] == outcome, (
        info["error"],
        info["harness_output"],
        info["grade"],
    )
    if outcome == "passed":
        assert info["n_tool_calls"] >= 1 and info["reward"] > 0
        assert "fullmatch" in info["patch"]
    else:
        assert info["patch"] == "" and info["reward"] <= 0
