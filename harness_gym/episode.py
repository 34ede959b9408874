"""One whole harness episode: sandbox, session, CLI run, grading, reward, cleanup.

`EpisodeRunner.run(task)` is the macro-step behind `env.step()`. Every episode ends: the CLI is
killed (its whole process group, and tool processes that left it) at `episode_timeout_s`, and the
sandbox and proxy session are closed whatever happened. Failures are kept apart by outcome:
`timeout` (the CLI or the tests ran out of time), `harness_error` (the CLI failed and the tests
did not pass), `infra_error` (our side failed: sandbox, install, test patch), never a silent
`failed`.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .engines import Engine, load_engine
from .harness import Endpoint, HarnessError, HarnessOutput, HarnessSpec
from .proxy import InterceptionProxy
from .rewards import RewardConfig
from .sandbox import default_sandbox, load_sandbox
from .sandbox.base import SandboxBackend, SandboxError, SandboxSpec
from .tasks.grader import capture_patch, grade
from .tasks.loader import materialize
from .tasks.task import Task

log = logging.getLogger(__name__)

TASK_INSTRUCTION = (
    "\n\nResolve the issue above by editing the repository in the current directory. "
    "Do not modify the tests."
)


@dataclass
class EpisodeResult:
    task_id: str
    harness: str
    outcome: str
    reward: float
    reward_breakdown: dict[str, Any]
    n_llm_calls: int
    n_tool_calls: int
    tests: dict[str, str]
    patch: str
    trace: list[dict[str, Any]]
    duration_s: float
    n_truncations: int = 0
    harness_output: dict[str, Any] = field(default_factory=dict)
    grade: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    def info(self) -> dict[str, Any]:
        versions = [v for s in self.trace if s["role"] != "discarded" for v in s["policy_versions"]]
        return {
            "task_id": self.task_id,
            "harness": self.harness,
            "outcome": self.outcome,
            "reward_breakdown": self.reward_breakdown,
            "n_llm_calls": self.n_llm_calls,
            "n_tool_calls": self.n_tool_calls,
            "n_truncations": self.n_truncations,
            "tests": self.tests,
            "patch": self.patch,
            "trace": self.trace,
            "policy_version_min": min(versions, default=None),
            "policy_version_max": max(versions, default=None),
            "duration_s": self.duration_s,
            "harness_output": self.harness_output,
            "grade": self.grade,
            "error": self.error,
        }


class EpisodeRunner:
    """Runs episodes of one harness against one proxy; thread-safe (episodes may overlap)."""

    def __init__(
        self,
        proxy: InterceptionProxy,
        harness: HarnessSpec,
        backend: SandboxBackend,
        *,
        reward: RewardConfig,
        episode_timeout_s: float,
        test_timeout_s: float,
        context_overflow: str = "error",
    ) -> None:
        self.proxy = proxy
        self.context_overflow = context_overflow
        self.harness = harness
        self.backend = backend
        self.reward = reward
        self.episode_timeout_s = episode_timeout_s
        self.test_timeout_s = test_timeout_s
        self._repos = Path(tempfile.mkdtemp(prefix="harness-gym-repos-"))
        self._repo_lock = threading.Lock()

    def repo_for(self, task: Task) -> Path:
        """The task's base repository, materialized once per runner and copied per rollout."""
        dest = self._repos / task.instance_id
        with self._repo_lock:
            if not dest.exists():
                materialize(task, dest)
        return dest

    def sandbox_spec(self, task: Task) -> SandboxSpec:
        """What the task's sandbox starts from: a directory task's materialized repo (copied
        in), or a dataset row's image, whose checkout is used where it lies (`repo_path` in the
        row, SWE-bench's `/testbed` by default). Raises `SandboxError` for a row this backend
        cannot run."""
        if task.repo_dir is not None:
            return SandboxSpec(
                repo=self.repo_for(task), image=task.image_name, label=task.instance_id
            )
        if not task.image_name:
            raise SandboxError(
                f"task {task.instance_id!r} is a dataset row with no repo_dir and no image_name: "
                "its repository lives only in its docker image; give the row an image_name and "
                'run it with sandbox="docker"'
            )
        if not getattr(self.backend, "runs_images", False):
            raise SandboxError(
                f"task {task.instance_id!r} is a dataset row: its repository lives in the image "
                f"{task.image_name!r}, which the {getattr(self.backend, 'name', '?')!r} sandbox "
                'cannot run; use sandbox="docker"'
            )
        return SandboxSpec(
            repo=None,
            image=task.image_name,
            workdir=str(task.extra.get("repo_path") or "/testbed"),
            label=task.instance_id,
        )

    def run(
        self,
        task: Task,
        *,
        sampling: dict[str, Any] | None = None,
        policy_version: int | None = None,
    ) -> EpisodeResult:
        started = time.monotonic()
        sandbox = session = None
        outcome, error = "infra_error", None
        tests: dict[str, str] = {}
        patch = ""
        output = HarnessOutput(None, None, "")
        grade_info: dict[str, Any] = {}
        try:
            sandbox = self.backend.create(self.sandbox_spec(task))
            session = self.proxy.open_session(policy_version, sampling, self.context_overflow)
            endpoint = Endpoint(
                base_url=sandbox.proxy_url(self.proxy.url),
                api_key=session.session_id,
                model=self.proxy.engine.model_name,
                context_length=self.proxy.engine.max_context,
            )
            job = self.harness.launch(sandbox, endpoint, task.problem_statement + TASK_INSTRUCTION)
            run = job.wait(timeout=self.episode_timeout_s)
            output = self.harness.parse_output(run.stdout)
            if run.timed_out:
                outcome = "timeout"
                error = f"the harness ran past episode_timeout_s={self.episode_timeout_s:g}"
                patch = _patch_or_empty(sandbox, task)
            else:
                graded = grade(task, sandbox, timeout_s=self.test_timeout_s)
                outcome, tests, patch, error = graded.outcome, graded.to_info()["tests"], graded.patch, graded.error
                grade_info = {"f2p": vars(graded.f2p), "p2p": vars(graded.p2p),
                              "failing": graded.failing, "test_output": graded.test_output,
                              "duration_s": graded.duration_s}
                harness_failed = run.exit_code != 0 or output.error is not None
                if outcome == "failed" and harness_failed:
                    outcome = "harness_error"
                    error = output.error or f"the harness exited with code {run.exit_code}"
        except Exception as exc:  # every episode ends with an outcome; ours failed, not the model
            outcome, error = "infra_error", f"{type(exc).__name__}: {exc}"
            log.warning("episode of %s on %s: %s", self.harness.name, task.instance_id, error,
                        exc_info=not isinstance(exc, (SandboxError, HarnessError, OSError)))
        finally:
            trace_json = session.trace_json() if session is not None else {}
            if session is not None:
                self.proxy.close_session(session.session_id)
            if sandbox is not None:
                sandbox.close()
        n_tool_calls = trace_json.get("n_tool_calls", 0)
        reward, breakdown = self.reward(outcome, n_tool_calls)
        return EpisodeResult(
            task_id=task.instance_id,
            harness=self.harness.name,
            outcome=outcome,
            reward=reward,
            reward_breakdown=breakdown,
            n_llm_calls=trace_json.get("n_llm_calls", 0),
            n_tool_calls=n_tool_calls,
            tests=tests,
            patch=patch,
            trace=trace_json.get("segments", []),
            duration_s=time.monotonic() - started,
            n_truncations=trace_json.get("n_truncations", 0),
            harness_output={"final_message": output.final_message,
                            "n_tool_calls": output.n_tool_calls, "tail": output.tail,
                            "error": output.error},
            grade=grade_info,
            error=error,
        )

    def close(self) -> None:
        shutil.rmtree(self._repos, ignore_errors=True)


class EpisodeStack:
    """What an env starts once and shares across its episodes: the engine, one proxy in front
    of it, the sandbox backend, and one `EpisodeRunner` per harness (installed on the way).

    `HarnessSWEEnv`, `HarnessVectorEnv` and each Ray node build one; an engine given as an
    object stays the caller's (not closed here), one given as a spec is closed with the stack.
    """

    def __init__(
        self,
        engine: str | Engine,
        harnesses: Sequence[HarnessSpec],
        *,
        sandbox: str | SandboxBackend | None,
        reward: RewardConfig,
        episode_timeout_s: float,
        test_timeout_s: float,
        context_overflow: str = "error",
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.engine = load_engine(engine)
        self._owns_engine = not isinstance(engine, Engine)
        self.proxy = InterceptionProxy(self.engine).start()
        self.backend = load_sandbox(sandbox or default_sandbox())
        self.runners: dict[str, EpisodeRunner] = {}
        for spec in harnesses:
            if spec.name not in self.runners:
                spec.install(progress=progress)
                self.runners[spec.name] = EpisodeRunner(
                    self.proxy, spec, self.backend, reward=reward,
                    episode_timeout_s=episode_timeout_s, test_timeout_s=test_timeout_s,
                    context_overflow=context_overflow,
                )

    def run(
        self,
        harness: str,
        task: Task,
        *,
        sampling: dict[str, Any] | None = None,
        policy_version: int | None = None,
    ) -> EpisodeResult:
        add_tasks = getattr(self.engine, "add_tasks", None)
        if add_tasks is not None:  # the oracle learns each answer as its episode starts
            add_tasks([task])
        return self.runners[harness].run(task, sampling=sampling, policy_version=policy_version)

    def close(self) -> None:
        self.proxy.stop()
        self.backend.close()
        for runner in self.runners.values():
            runner.close()
        if self._owns_engine and hasattr(self.engine, "close"):
            self.engine.close()


def _patch_or_empty(sandbox: Any, task: Task) -> str:
    """The agent's diff so far, for an episode that is not graded (best effort)."""
    try:
        return capture_patch(sandbox, task.base_commit or "HEAD")
    except Exception as exc:  # a broken tree must not hide the timeout itself
        log.warning("could not capture the patch of %s: %s", task.instance_id, exc)
        return ""
