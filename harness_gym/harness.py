"""The harness plugin seam: what harness-gym knows about one coding-agent CLI, kept as data.

A harness plugin is a `HarnessSpec` subclass registered in the entry-point group
`harness_gym.harnesses` (the built-ins are registered the same way in setup.cfg). It states its
package (manager, name, pinned version, executable), the API dialect it speaks, the name of its
shell tool, the fixed environment that keeps it offline, and three small functions of the
endpoint: its argv, its config files (written into the sandbox's HOME) and its endpoint
environment. `parse_output` reads what the CLI printed.

Two things every spec must get right, because the CLIs get them wrong by default:

- The task text reaches the model byte for byte. CLIs read an argument starting with "-" as a
  flag, one starting with "@" as a file, and quote or escape some (OpenCode); a single argument
  is also capped at 128 KiB by the kernel. A spec may therefore deliver the prompt, or part of
  it, on the CLI's stdin (`stdin`); `prepare` writes it to a file and redirects it.
- The CLI knows the model's limits: `Endpoint.context_length` (the engine's context window) and
  `Endpoint.max_tokens` (the output cap the proxy enforces) go into the CLI's own settings, so
  it neither asks for more than it gets (a continuation loop) nor reserves more than the window
  holds (a compaction loop). `min_context` says how small a window the CLI can work in at all;
  the episode ends `infra_error` before starting it against a smaller one.

One episode, as the environment drives it::

    harness = load_harness("pi")
    harness.install(progress=print)                  # once per machine; cached, lock-protected
    plan = harness.prepare(sandbox, Endpoint(base_url, api_key, model="policy"), task_text)
    job = sandbox.start(plan.argv, cwd=plan.cwd, env=plan.env)
    result = job.wait(timeout=episode_timeout_s)      # kills the process group on timeout
    output = harness.read_output(result)              # final message, tool calls, stderr tail

Installs go to `$HARNESS_GYM_CACHE/harnesses/<name>-<version>/` (default
`~/.cache/harness-gym`), never into the repo or a sandbox: 200-350 MB per CLI, shared by every
episode. The executable's path is a host path: `sandbox_mounts()` says what of the host the CLI
needs read-only (its install dir at the same path, and the runtime it was installed with), and the
episode layer passes that to the sandbox in `SandboxSpec.ro_mounts`.
"""

from __future__ import annotations

import abc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from filelock import FileLock

from .plugins import load_plugin, plugin_names
from .sandbox.base import ExecResult, Job, Sandbox
from .trace import ContextOverflow

Dialect = Literal["openai-chat", "anthropic-messages", "openai-responses", "gemini"]
Progress = Callable[[str], None]

ENTRY_POINT_GROUP = "harness_gym.harnesses"
INSTALL_TIMEOUT_S = 900
# Where the host's node goes in a sandbox with its own system (a container): on the default PATH,
# ahead of the image's own node (bookworm's is 18; Pi 0.73 needs >= 20, and the cached npm
# harnesses may hold native addons built for the host node's ABI).
NODE_IN_SANDBOX = "/usr/local/bin/node"
_INSTALLED_MARKER = ".harness-gym-installed.json"
PROMPT_FILE = ".harness-gym/prompt.txt"  # under the sandbox's HOME, when a spec uses stdin
# An answer gets at most this share of the context: a CLI reserves its output cap out of the
# window, and must keep room for the conversation.
MAX_OUTPUT_SHARE = 4


class HarnessError(RuntimeError):
    """A harness could not be found, installed or prepared."""


class ContextTooSmall(HarnessError):
    """The CLI cannot work in the model's context window: the episode is an `infra_error`
    (nothing the policy did), reported before or as soon as the CLI starts."""


@dataclass(frozen=True)
class Endpoint:
    """Where a harness sends its model calls.

    `base_url` is the server root without a version path (`http://127.0.0.1:8123`); each spec
    appends what its client library expects (`/v1` for OpenAI SDKs; Anthropic's SDK adds
    `/v1/messages` itself). `api_key` is the proxy session key. `context_length` is the model's
    window (prompt + answer, in its tokens), `max_tokens` the most tokens one answer may have:
    `Endpoint.for_model` derives both from the engine and the session.
    """

    base_url: str
    api_key: str
    model: str = "policy"
    context_length: int = 65_536
    max_tokens: int = 4_096

    @classmethod
    def for_model(
        cls, base_url: str, api_key: str, model: str, context_length: int, max_tokens: int
    ) -> Endpoint:
        """The endpoint of a model with `context_length` tokens of context whose session caps an
        answer at `max_tokens`: the cap told to the CLI is also at most a quarter of the window
        (a CLI reserves it out of the window: 4096 of 8192 left SmolLM2 too little room)."""
        cap = max(1, min(max_tokens, context_length // MAX_OUTPUT_SHARE))
        return cls(base_url, api_key, model, context_length, cap)


@dataclass(frozen=True)
class Package:
    """A CLI as its registry knows it. `bin` is the executable's name once installed."""

    manager: Literal["npm", "pip"]
    name: str
    version: str
    bin: str
    extras: tuple[str, ...] = ()  # more requirement specs installed beside it, pinned too

    @property
    def relocatable(self) -> bool:
        # npm's .bin links are relative, so a staged node_modules can be renamed into place;
        # a venv's scripts carry absolute shebangs and must be built where they will live.
        return self.manager == "npm"

    def runtime_mounts(self) -> dict[str, str]:
        """Host path -> sandbox path of the runtime the package was installed with."""
        node = shutil.which("node") if self.manager == "npm" else None
        return {os.path.realpath(node): NODE_IN_SANDBOX} if node else {}

    def executable_in(self, prefix: Path) -> Path:
        sub = "node_modules/.bin" if self.manager == "npm" else "bin"
        return prefix / sub / self.bin

    def install_into(self, prefix: Path) -> None:
        if self.manager == "npm":
            commands = [
                [
                    "npm", "install", "--prefix", str(prefix), "--no-audit", "--no-fund",
                    "--loglevel=error", f"{self.name}@{self.version}", *self.extras,
                ]
            ]
        else:
            commands = [
                [sys.executable, "-m", "venv", str(prefix)],
                [
                    str(prefix / "bin" / "python"), "-m", "pip", "install", "--quiet",
                    "--disable-pip-version-check", f"{self.name}=={self.version}", *self.extras,
                ],
            ]
        env = {**os.environ, "npm_config_update_notifier": "false"}
        for argv in commands:
            try:
                done = subprocess.run(
                    argv, env=env, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S,
                    stdin=subprocess.DEVNULL,
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise HarnessError(f"`{' '.join(argv)}` could not run: {exc}") from exc
            if done.returncode != 0:
                raise HarnessError(
                    f"`{' '.join(argv)}` failed with exit code {done.returncode}:\n"
                    f"{(done.stderr or done.stdout)[-2000:]}"
                )


@dataclass
class LaunchPlan:
    """How to start the CLI headless: argv, its environment (added to the sandbox's), cwd."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None  # None: the sandbox's workdir


@dataclass
class HarnessOutput:
    """What the CLI reported. `n_tool_calls` is the CLI's own count, None if it prints none.
    `tail` is the end of its stdout, `stderr_tail` of its stderr (where some CLIs say why they
    failed)."""

    final_message: str | None
    n_tool_calls: int | None
    tail: str
    error: str | None = None  # an error the CLI reported (model call failed, bad config)
    stderr_tail: str = ""


def harness_cache_dir() -> Path:
    root = os.environ.get("HARNESS_GYM_CACHE") or "~/.cache/harness-gym"
    return Path(root).expanduser() / "harnesses"


class HarnessSpec(abc.ABC):
    """One coding-agent CLI. Subclasses fill in the class attributes and the three endpoint
    functions; installing, locating and launching are shared."""

    name: ClassVar[str]
    package: ClassVar[Package]
    dialect: ClassVar[Dialect]
    shell_tool: ClassVar[str]  # its shell tool's name in the request's tool list ("": no tools)
    env: ClassVar[Mapping[str, str]] = {}  # fixed variables for a headless, offline run
    # The smallest context window (in the model's tokens) the CLI can work in; measured, per
    # spec. An episode against a smaller window ends `infra_error` before the CLI starts.
    min_context: ClassVar[int] = 0

    # -- per-harness knowledge ---------------------------------------------------------------

    @abc.abstractmethod
    def args(self, endpoint: Endpoint, prompt: str) -> list[str]:
        """Arguments after the executable for one headless run on `prompt`."""

    def stdin(self, prompt: str) -> str | None:
        """What the CLI reads on stdin for `prompt` (None: nothing; stdin is /dev/null). `args`
        and `stdin` together must deliver the prompt exactly."""
        return None

    def config_files(self, endpoint: Endpoint) -> dict[str, str]:
        """Files to write, by path relative to the sandbox's HOME."""
        return {}

    def endpoint_env(self, endpoint: Endpoint) -> dict[str, str]:
        """Environment variables that point the CLI at `endpoint`."""
        return {}

    @abc.abstractmethod
    def parse_output(self, stdout: str) -> HarnessOutput: ...

    def stderr_error(self, stderr: str) -> str | None:
        """The failure a CLI reports on stderr only (None: it reports none there)."""
        return None

    def read_output(self, result: ExecResult) -> HarnessOutput:
        """`parse_output` of the run's stdout, with its stderr tail and any error said there."""
        output = self.parse_output(result.stdout)
        output.stderr_tail = tail(result.stderr)
        if output.error is None:
            output.error = self.stderr_error(result.stderr)
        return output

    def check_context(self, context_length: int) -> None:
        """Raise `ContextTooSmall` when the CLI cannot work in a window of `context_length`."""
        if context_length < self.min_context:
            raise ContextTooSmall(
                f"{self.name} needs a context window of at least {self.min_context} tokens "
                f"(its min_context), but the model has {context_length}: use a model with a "
                f"larger context, or another harness"
            )

    def check_first_prompt(self, refused: ContextOverflow | None) -> None:
        """Raise `ContextTooSmall` when the proxy refused the CLI's very first prompt as too long
        (`SessionTrace.first_prompt_overflowed`): a tighter measure than `min_context`, taken in
        the model's own tokens."""
        if refused is not None:
            raise ContextTooSmall(
                f"{self.name}'s first request is {refused.prompt_tokens} tokens, more than the "
                f"model's context of {refused.max_context}: it cannot start; use a model with a "
                f"larger context, or another harness"
            )

    # -- shared machinery --------------------------------------------------------------------

    def install_dir(self, cache_dir: Path | str | None = None) -> Path:
        root = Path(cache_dir) if cache_dir is not None else harness_cache_dir()
        return root / f"{self.name}-{self.package.version}"

    def sandbox_mounts(self, cache_dir: Path | str | None = None) -> dict[str, str]:
        """What of the host the CLI needs in its sandbox, read-only: host path -> sandbox path
        (its install at the same path, so the executable's host path works inside)."""
        install = str(self.install_dir(cache_dir))
        return {install: install, **self.package.runtime_mounts()}

    def is_installed(self, cache_dir: Path | str | None = None) -> bool:
        return (self.install_dir(cache_dir) / _INSTALLED_MARKER).is_file()

    def executable(self, cache_dir: Path | str | None = None) -> Path:
        return self.package.executable_in(self.install_dir(cache_dir))

    def install(
        self, cache_dir: Path | str | None = None, progress: Progress | None = None
    ) -> Path:
        """Install the pinned package into the cache once; return its directory.

        Safe when many episodes start at once: one installs under a file lock, the others
        wait and then find it done. A crashed install never looks finished: the marker file
        is written last, and npm installs are staged in a temp dir and renamed into place.
        """
        target = self.install_dir(cache_dir)
        if self.is_installed(cache_dir):
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(target.parent / f".{target.name}.lock"):  # across processes and threads
            if self.is_installed(cache_dir):
                return target
            pkg = self.package
            if progress:
                progress(f"installing {self.name}: {pkg.manager} {pkg.name}@{pkg.version}")
            started = time.monotonic()
            shutil.rmtree(target, ignore_errors=True)  # leftovers of a crashed install
            stage = (
                Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
                if pkg.relocatable
                else target
            )
            try:
                pkg.install_into(stage)
                if not pkg.executable_in(stage).exists():
                    raise HarnessError(f"{pkg.name} installed, but {pkg.bin} is not in it")
                marker = {"package": pkg.name, "version": pkg.version,
                          "seconds": round(time.monotonic() - started, 1)}
                (stage / _INSTALLED_MARKER).write_text(json.dumps(marker))
                if stage != target:
                    os.rename(stage, target)
            except BaseException:
                shutil.rmtree(stage, ignore_errors=True)
                raise
            if progress:
                progress(f"installed {self.name} in {time.monotonic() - started:.0f} s")
        return target

    def prepare(
        self,
        sandbox: Sandbox,
        endpoint: Endpoint,
        prompt: str,
        cache_dir: Path | str | None = None,
    ) -> LaunchPlan:
        """Write the config files into the sandbox's HOME; return how to start the CLI."""
        if not self.is_installed(cache_dir):
            raise HarnessError(
                f"{self.name} {self.package.version} is not installed in "
                f"{self.install_dir(cache_dir)}: call install() first"
            )
        for rel_path, content in self.config_files(endpoint).items():
            sandbox.write_file(f"{sandbox.home}/{rel_path}", content, mode=0o600)
        argv = [str(self.executable(cache_dir)), *self.args(endpoint, prompt)]
        stdin = self.stdin(prompt)
        if stdin is not None:
            path = f"{sandbox.home}/{PROMPT_FILE}"
            sandbox.write_file(path, stdin, mode=0o600)
            # `sh -c SCRIPT $0 $@...`: the file is $0, the CLI's argv is "$@", exec'd in place
            # (same process, same process group) with stdin redirected.
            argv = ["sh", "-c", 'exec "$@" < "$0"', path, *argv]
        return LaunchPlan(argv=argv, env={**self.env, **self.endpoint_env(endpoint)})

    def launch(
        self,
        sandbox: Sandbox,
        endpoint: Endpoint,
        prompt: str,
        cache_dir: Path | str | None = None,
    ) -> Job:
        """`prepare`, then start the CLI in the background in its own process group."""
        plan = self.prepare(sandbox, endpoint, prompt, cache_dir)
        return sandbox.start(plan.argv, cwd=plan.cwd, env=plan.env)


def available_harnesses() -> list[str]:
    """Names of the installed harness plugins."""
    return plugin_names(ENTRY_POINT_GROUP)


def load_harness(spec: str | HarnessSpec) -> HarnessSpec:
    """A harness plugin by entry-point name (`"pi"`), or the given spec unchanged."""
    if isinstance(spec, HarnessSpec):
        return spec
    return load_plugin(ENTRY_POINT_GROUP, spec, HarnessSpec, noun="harness", error=HarnessError)


def json_events(stdout: str) -> Iterator[dict[str, Any]]:
    """The JSON objects of a CLI's JSON-lines output; other lines (plain notices the CLIs mix
    in) are skipped."""
    for line in stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            yield event


def tail(text: str, limit: int = 4_000) -> str:
    """The last `limit` characters, for error reports."""
    return text[-limit:]
