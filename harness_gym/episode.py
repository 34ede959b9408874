"""One whole harness episode: sandbox, session, CLI run, grading, reward, cleanup.

`EpisodeRunner.run(task)` is the macro-step behind `env.step()`. Every episode ends: the CLI is
killed (its whole process group, and tool processes that left it) at `episode_timeout_s`, and the
sandbox and proxy session are closed whatever happened. When the CLI has ended, every process it
or its agent started is killed (`Sandbox.kill_processes`) before the grader touches the tree: a
background writer left by the agent cannot change the verdict. Failures are kept apart by
outcome: `timeout` (the CLI or the tests ran out of time), `harness_error` (the CLI failed and
the tests did not pass, or the episode broke under the agent: it hit a sandbox cap such as the
disk, or its proxy session was closed), `infra_error` (our side failed: sandbox, install, test
patch; the engine failed a model call, e.g. its server died mid-stream; or the harness cannot
work in the model's context window: its declared `min_context` is larger, checked before
anything starts, or the proxy refused its very first prompt as too long, which stops the CLI at
once), never a silent `failed`. Nothing an agent does raises out of
`run()`.
"""

from __future__ import annotations

import logging
import secrets
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .config import EpisodeConfig
from .engines import Engine, load_engine
from .engines.auto import engine_for_episodes
from .harness import Endpoint, HarnessError, HarnessOutput, HarnessSpec
from .proxy import InterceptionProxy
from .proxy.errors import ProxyError
from .proxy.sessions import ProxySession
from .rewards import RewardConfig
from .sandbox import default_sandbox, load_sandbox
from .sandbox.caps import require_caps
from .sandbox.base import ExecResult, Job, SandboxBackend, SandboxError, SandboxSpec
from .tasks.grader import GradeResult, capture_patch, grade
from .tasks.loader import materialize
from .tasks.mine.envs import env_mounts
from .tasks.task import Task
from .trace import SessionTrace

log = logging.getLogger(__name__)

_WATCH_INTERVAL_S = 0.25  # how often a running episode checks for a refused first prompt or a stop


class EpisodeStopped(RuntimeError):
    """The episode was stopped from outside (`EpisodeStack.stop_running`): an `infra_error`."""

TASK_INSTRUCTION = (
    "\n\nResolve the issue above by editing the repository in the current directory. "
    "Do not modify the tests."
)


@dataclass(frozen=True)
class EpisodeRequest:
    """One episode to run: which harness on which task, with the session's sampling and the
    policy version its calls are labelled with (None: the engine's current one)."""

    harness: str
    task: Task
    sampling: dict[str, Any] = field(default_factory=dict)
    policy_version: int | None = None


@dataclass
class EpisodeResult:
    """One finished episode, typed; `info()` is the one place it becomes plain data.

    `model` is the engine's model name and `tokenizer` what `harness-gym trace` reloads the
    tokenizer from (`Engine.tokenizer_source`: "tiny", "smollm2" or a directory; None when the
    engine names none), so a trace is decoded with the tokenizer that made its ids.
    """

    task_id: str
    harness: str
    outcome: str
    reward: float
    reward_breakdown: dict[str, Any]
    patch: str = ""
    duration_s: float = 0.0
    trace: SessionTrace = field(default_factory=SessionTrace)
    model: str | None = None
    tokenizer: str | None = None
    harness_output: HarnessOutput = field(default_factory=lambda: HarnessOutput(None, None, ""))
    grade: GradeResult | None = None
    error: str | None = None

    @classmethod
    def never_ran(cls, request: EpisodeRequest, reward: RewardConfig, error: str) -> EpisodeResult:
        """The `infra_error` result of an episode that could not run at all (our side)."""
        value, breakdown = reward("infra_error", 0)
        return cls(request.task.instance_id, request.harness, "infra_error", value, breakdown,
                   error=error)

    @property
    def n_llm_calls(self) -> int:
        return self.trace.n_llm_calls

    @property
    def n_tool_calls(self) -> int:
        return self.trace.n_tool_calls

    @property
    def n_truncations(self) -> int:
        return self.trace.n_truncations

    @property
    def call_limit_reached(self) -> bool:
        """The CLI was stopped at the config's `max_model_calls` (the tree graded as it was)."""
        return self.trace.call_limit_refusals > 0

    @property
    def tests(self) -> dict[str, str]:
        """Per-test status of the graded run (empty when the tests did not run)."""
        if self.grade is None:
            return {}
        return {test: str(status) for test, status in self.grade.tests.items()}

    def info(self) -> dict[str, Any]:
        versions = [v for s in self.trace.segments if s.role != "discarded"
                    for v in s.policy_versions]
        return {
            "task_id": self.task_id,
            "harness": self.harness,
            "outcome": self.outcome,
            "reward_breakdown": self.reward_breakdown,
            "n_llm_calls": self.n_llm_calls,
            "n_tool_calls": self.n_tool_calls,
            "n_truncations": self.n_truncations,
            "call_limit_reached": self.call_limit_reached,
            "tests": self.tests,
            "patch": self.patch,
            "trace": self.trace.to_dicts(),
            "model": self.model,
            "tokenizer": self.tokenizer,
            "policy_version_min": min(versions, default=None),
            "policy_version_max": max(versions, default=None),
            "duration_s": self.duration_s,
            "harness_output": asdict(self.harness_output),
            "grade": _grade_info(self.grade),
            "error": self.error,
        }


def _grade_info(graded: GradeResult | None) -> dict[str, Any]:
    if graded is None:
        return {}
    return {"f2p": asdict(graded.f2p), "p2p": asdict(graded.p2p), "failing": graded.failing,
            "test_output": graded.test_output, "duration_s": graded.duration_s,
            "reason": graded.reason, "notes": graded.notes}


class EpisodeRunner:
    """Runs episodes of one harness against one proxy; thread-safe (episodes may overlap)."""

    def __init__(
        self,
        proxy: InterceptionProxy,
        harness: HarnessSpec,
        backend: SandboxBackend,
        config: EpisodeConfig,
    ) -> None:
        self.proxy = proxy
        self.harness = harness
        self.backend = backend
        self.config = config
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
        # A mined task's Python env (its package's dependencies), read-only, beside the CLI's.
        mounts = {**self.harness.sandbox_mounts(), **env_mounts(task, self.backend)}
        if task.repo_dir is not None:
            return SandboxSpec(repo=self.repo_for(task), image=task.image_name,
                               label=task.instance_id, ro_mounts=mounts)
        if not task.image_name:
            raise SandboxError(
                f"task {task.instance_id!r} is a dataset row with no repo_dir and no image_name: "
                "its repository lives only in its docker image; give the row an image_name and "
                'run it with sandbox="docker"'
            )
        if not self.backend.runs_images:
            raise SandboxError(
                f"task {task.instance_id!r} is a dataset row: its repository lives in the image "
                f"{task.image_name!r}, which the {self.backend.name!r} sandbox "
                'cannot run; use sandbox="docker"'
            )
        return SandboxSpec(
            repo=None,
            image=task.image_name,
            workdir=str(task.extra.get("repo_path") or "/testbed"),
            label=task.instance_id,
            ro_mounts=mounts,
        )

    def run(
        self,
        task: Task,
        *,
        sampling: dict[str, Any] | None = None,
        policy_version: int | None = None,
        on_session: Callable[[ProxySession], None] | None = None,
        stopping: threading.Event | None = None,
    ) -> EpisodeResult:
        """One episode. `on_session` sees the proxy session as soon as it opens (a Ray node
        runner reports from it whether the episode has made a model call yet); once `stopping`
        is set the episode ends (its CLI killed, an `infra_error`), or never starts."""
        started = time.monotonic()
        if stopping is None:
            stopping = threading.Event()  # never set
        config, engine = self.config, self.proxy.engine
        sandbox = session = None
        outcome, error = "infra_error", None
        patch = ""
        output = HarnessOutput(None, None, "")
        graded: GradeResult | None = None
        trace = SessionTrace()
        try:
            if stopping.is_set():
                raise EpisodeStopped("stopped before it started")
            self.harness.check_context(engine.max_context)  # before anything starts
            sandbox = self.backend.create(self.sandbox_spec(task))
            session = self.proxy.open_session(policy_version, sampling, config.context_overflow,
                                              config.train_subagents, config.max_model_calls)
            if on_session is not None:
                on_session(session)
            endpoint = Endpoint.for_model(
                sandbox.proxy_url(self.proxy.url), session.session_id, engine.model_name,
                engine.max_context, self._output_cap(session.sampling),
            )
            job = self.harness.launch(sandbox, endpoint, task.problem_statement + TASK_INSTRUCTION)
            run = _wait_unless_it_cannot_start(job, session.trace, config.episode_timeout_s,
                                               stopping)
            # Nothing the agent started may still run while the grader works (invariant 7).
            sandbox.kill_processes()
            if stopping.is_set():
                raise EpisodeStopped("stopped while its harness ran (its owner stopped it)")
            output = self.harness.read_output(run)
            self.harness.check_first_prompt(session.trace.first_prompt_overflowed)
            broken = sandbox.fault or (
                "its proxy session was closed during the episode (by the proxy's owner or its "
                "idle expiry)" if session.closed else None
            )
            if broken is not None:
                outcome, error = "harness_error", broken
                patch = _patch_or_empty(sandbox, task)
            elif run.timed_out:
                outcome = "timeout"
                error = f"the harness ran past episode_timeout_s={config.episode_timeout_s:g}"
                patch = _patch_or_empty(sandbox, task)
            else:
                graded = grade(task, sandbox, timeout_s=config.test_timeout_s)
                outcome, patch, error = graded.outcome, graded.patch, graded.error
                # A CLI stopped at its call limit was stopped by us, not broken.
                harness_failed = not session.trace.call_limit_refusals and (
                    run.exit_code != 0 or output.error is not None)
                if outcome == "failed" and harness_failed and graded.reason != "tampered":
                    outcome = "harness_error"
                    error = output.error or f"the harness exited with code {run.exit_code}"
            if session.trace.engine_failures:  # the CLI was cut off by our side, whatever followed
                outcome = "infra_error"
                error = (f"the engine failed {len(session.trace.engine_failures)} call(s) during "
                         f"the episode; the first: {session.trace.engine_failures[0]}")
        except Exception as exc:  # every episode ends with an outcome; ours failed, not the model
            outcome, error = "infra_error", f"{type(exc).__name__}: {exc}"
            log.warning("episode of %s on %s: %s", self.harness.name, task.instance_id, error,
                        exc_info=not isinstance(exc, (SandboxError, HarnessError, OSError,
                                                      EpisodeStopped)))
        finally:
            if session is not None:
                trace = session.trace.snapshot()
                try:
                    self.proxy.close_session(session.session_id)
                except ProxyError:  # closed already (the agent deleted it): nothing to close
                    pass
            if sandbox is not None:
                try:
                    sandbox.close()
                except Exception as exc:  # leftovers are logged; the episode still has a result
                    outcome, error = "infra_error", f"could not close the sandbox: {exc}"
                    log.warning("episode of %s on %s: %s", self.harness.name, task.instance_id,
                                error)
        reward, breakdown = config.reward(outcome, trace.n_tool_calls)
        return EpisodeResult(
            task_id=task.instance_id,
            harness=self.harness.name,
            outcome=outcome,
            reward=reward,
            reward_breakdown=breakdown,
            patch=patch,
            duration_s=time.monotonic() - started,
            trace=trace,
            model=engine.model_name,
            tokenizer=engine.tokenizer_source,
            harness_output=output,
            grade=graded,
            error=error,
        )

    def _output_cap(self, sampling: dict[str, Any]) -> int:
        """The most tokens the proxy lets one answer have in this session."""
        return int(sampling.get("max_tokens") or self.proxy.app.settings.default_max_tokens)

    def close(self) -> None:
        shutil.rmtree(self._repos, ignore_errors=True)


class EpisodeStack:
    """What an env starts once and shares across its episodes: the engine, one proxy in front
    of it, the sandbox backend, and one `EpisodeRunner` per harness (installed on the way).

    `HarnessSWEEnv`, the thread executor and each Ray node build one from an `EpisodeConfig`.
    An engine given as an object stays the caller's (not closed here); one given as a spec is
    closed with the stack, before the proxy stops (a remote engine's connections live on the
    proxy's event loop). `in_flight` is the most episodes it runs at once: it picks what the
    default engine `auto` is (`engines.auto.engine_for_episodes`).
    """

    def __init__(self, config: EpisodeConfig, in_flight: int = 1) -> None:
        self.config = config
        self.engine = load_engine(engine_for_episodes(config.engine, in_flight))
        self._owns_engine = not isinstance(config.engine, Engine)
        self.runners: dict[str, EpisodeRunner] = {}
        self.proxy: InterceptionProxy | None = None
        self.backend: SandboxBackend | None = None
        self._stop_lock = threading.Lock()
        self._stopping = threading.Event()
        try:
            # An admin key the agents never see: a session key reaches its model routes only.
            self.proxy = InterceptionProxy(self.engine, admin_key=secrets.token_urlsafe(32)).start()
            self.backend = load_sandbox(config.sandbox or default_sandbox())
            require_caps(self.backend, config.limits, allow_uncapped=config.allow_uncapped)
            say = (lambda m: print(m, file=sys.stderr)) if config.progress else None
            for spec in config.harness:
                if spec.name not in self.runners:
                    spec.install(progress=say)
                    self.runners[spec.name] = EpisodeRunner(self.proxy, spec, self.backend, config)
        except BaseException:
            self.close()
            raise

    @property
    def stopping(self) -> threading.Event:
        """What the next `stop_running()` sets. An executor takes it when it queues an
        episode (`run(stopping=...)`), so a stop also ends what is queued but not yet begun."""
        with self._stop_lock:
            return self._stopping

    def run(
        self,
        request: EpisodeRequest,
        on_session: Callable[[ProxySession], None] | None = None,
        stopping: threading.Event | None = None,
    ) -> EpisodeResult:
        """Run one episode; a harness this stack has no runner for is an `infra_error`.
        `stopping` (the stack's current one by default) ends it when set."""
        runner = self.runners.get(request.harness)
        if runner is None:
            return EpisodeResult.never_ran(request, self.config.reward,
                                           f"no runner for harness {request.harness!r} here")
        stopping = self.stopping if stopping is None else stopping
        if not stopping.is_set():  # one stopped before it began is no episode to the engine
            self.engine.on_episode_start(request.task)
        return runner.run(request.task, sampling=request.sampling,
                          policy_version=request.policy_version, on_session=on_session,
                          stopping=stopping)

    def stop_running(self) -> None:
        """End every episode running on this stack, or queued for it, within about
        `_WATCH_INTERVAL_S` (its CLI killed, its sandbox closed: an `infra_error`). Episodes
        begun after it run as usual: a stop ends what is there, it does not shut the stack (a
        notebook's interrupted loop leaves an env that still works)."""
        with self._stop_lock:
            stopping, self._stopping = self._stopping, threading.Event()
        stopping.set()

    def close(self) -> None:
        """Release everything the stack started. Idempotent."""
        runners, self.runners = list(self.runners.values()), {}
        for runner in runners:
            runner.close()
        if self._owns_engine:
            self._owns_engine = False
            self.engine.close()
        proxy, self.proxy = self.proxy, None
        if proxy is not None:
            proxy.stop()
        backend, self.backend = self.backend, None
        if backend is not None:
            backend.close()


def _wait_unless_it_cannot_start(
    job: Job, trace: SessionTrace, timeout_s: float, stopping: threading.Event | None = None
) -> ExecResult:
    """`job.wait(timeout_s)`, but the CLI is stopped as soon as the proxy refused its very first
    prompt as too long for the model: it cannot work in this context, and left alone it compacts
    or retries until the timeout (measured: OpenCode in SmolLM2's 8,192 tokens, 900 s); as soon
    as the proxy refused a call over the episode's `max_model_calls` (a CLI retries or reports
    the error, and the agent's work is graded as it stands); and as soon as `stopping` is set."""
    done: list[ExecResult | BaseException] = []

    def wait() -> None:
        try:
            done.append(job.wait(timeout=timeout_s))
        except BaseException as exc:  # re-raised in the episode's thread
            done.append(exc)

    waiter = threading.Thread(target=wait, name="harness-gym-episode-wait", daemon=True)
    waiter.start()
    while waiter.is_alive():
        waiter.join(_WATCH_INTERVAL_S)
        if waiter.is_alive() and (trace.first_prompt_overflowed is not None
                                  or trace.call_limit_refusals):
            job.kill()
            waiter.join()
        if waiter.is_alive() and stopping is not None and stopping.is_set():
            job.kill()
            waiter.join()
    if isinstance(done[0], BaseException):
        raise done[0]
    return done[0]


def _patch_or_empty(sandbox: Any, task: Task) -> str:
    """The agent's diff so far, for an episode that is not graded (best effort)."""
    try:
        return capture_patch(sandbox, task.base_commit or "HEAD")
    except Exception as exc:  # a broken tree must not hide the timeout itself
        log.warning("could not capture the patch of %s: %s", task.instance_id, exc)
        return ""
