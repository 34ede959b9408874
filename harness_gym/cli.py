"""The `harness-gym` command line."""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .harness import HarnessSpec


def _serve(args: argparse.Namespace) -> int:
    from .proxy import InterceptionProxy
    from .proxy.settings import settings_from_flags

    from .proxy.server import is_loopback

    admin_key = args.admin_key or os.environ.get("HARNESS_GYM_ADMIN_KEY")
    # No key on loopback: the admin routes stay open to local clients (the documented default
    # of the standalone proxy); anywhere else a key is made up and printed.
    open_admin = not admin_key and is_loopback(args.host)
    proxy = InterceptionProxy(
        args.engine, host=args.host, port=args.port, admin_key=admin_key,
        open_admin=open_admin, settings=settings_from_flags(args),
    ).start()
    print(f"harness-gym proxy serving {proxy.engine.model_name} at {proxy.url}", flush=True)
    print(f"  OpenAI base URL: {proxy.base_url}   new session: POST {proxy.url}/sessions", flush=True)
    if open_admin:
        print("  admin routes (/sessions) are open to local clients; pass --admin-key to close "
              "them", flush=True)
    elif not admin_key:  # made up at start: the only way to learn it
        print(f"  admin key (for /sessions): {proxy.admin_key}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    proxy.stop()
    return 0


def _run(args: argparse.Namespace) -> int:
    from .env import HarnessSWEEnv
    from .runs.recording import run_episodes

    env = HarnessSWEEnv(tasks=args.tasks, **episode_settings(args))
    try:
        _start_env(env, args)
        summary = run_episodes(env, episodes=args.episodes, out_dir=Path(args.out),
                               task_ids=args.task_id or (), seed=args.seed,
                               progress=not args.quiet)
    finally:
        env.close()
    print(summary.describe())
    shown = _shown_path(summary.path)
    print(f"traces written to {shown}")
    print(f"next: harness-gym trace {shlex.quote(shown)} --html trace.html   "
          "(then open trace.html in a browser)")
    return 0


def episode_settings(args: argparse.Namespace) -> dict[str, Any]:
    """`EpisodeConfig` keywords from `run`/`demo` flags. A flag not given is left out, so its
    setting keeps EpisodeConfig's default: one source of defaults for the API and the CLI."""
    sampling = {} if args.max_tokens is None else {"max_tokens": args.max_tokens}
    if args.temperature is not None:
        sampling["temperature"] = args.temperature
    given = {"harness": args.harness, "engine": args.engine, "sandbox": args.sandbox,
             "episode_timeout_s": args.episode_timeout, "test_timeout_s": args.test_timeout,
             "max_model_calls": args.max_model_calls}
    return {"sampling": sampling, "progress": not args.quiet,
            **{name: value for name, value in given.items() if value is not None}}


def _start_env(env: Any, args: argparse.Namespace) -> None:
    """Load the engine, start the proxy and install the harness, saying what takes the time
    (a first SmolLM2 load converts its weights: about a minute on two cores)."""
    say = (lambda message: None) if args.quiet else _status
    say(f"loading engine {env.config.engine!r} and harness {env.harness.name!r}...")
    started = time.monotonic()
    if env.config.engine in ("auto", "smollm2"):  # one episode at a time: auto is smollm2
        from .engines.smollm2 import smollm2_is_converted

        if not smollm2_is_converted():
            say("first run: converting SmolLM2-135M's GGUF weights to safetensors (once, ~1 min)")
    env.proxy  # noqa: B018  # starts the engine, the proxy and the harness install
    say(f"ready in {time.monotonic() - started:.0f} s; model calls show on the progress line")


def _shown_path(path: Path) -> str:
    """`path` relative to the working directory where it lies below it (a shorter command)."""
    relative = os.path.relpath(path.resolve())
    return path.resolve().as_posix() if relative.startswith("..") else relative


def _status(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _trace(args: argparse.Namespace) -> int:
    from .runs import trace_view

    paths = [Path(f) for f in args.files] or [trace_view.newest_run(args.runs)]
    if not args.files:
        _status(f"showing the newest run: {_shown_path(paths[0])}")
    episodes = trace_view.select(trace_view.load_runs(paths), args.episode)
    tokenizers = trace_view.Tokenizers(override=args.tokenizer,
                                       warn=lambda note: _status(f"note: {note}"))
    if args.html:
        from .runs.trace_page import render_html

        title = paths[0].name if len(paths) == 1 else f"{len(paths)} runs"
        Path(args.html).write_text(render_html(episodes, tokenizers, title=title))
        print(f"wrote {_shown_path(Path(args.html))} ({len(episodes)} episodes); "
              "open it in a browser")
    else:
        trace_view.print_terminal(episodes, tokenizers, show_prompt=args.prompt)
    return 0


DEMO_TASK = "harness-gym__slugs-40"


def _demo(args: argparse.Namespace) -> int:
    """Pi + SmolLM2-135M on the CPU, one built-in task: the main job on embedded defaults."""
    args.harness, args.tasks, args.sandbox = "pi", "builtin", None
    args.episodes, args.task_id, args.seed, args.quiet = 1, [DEMO_TASK], 0, False
    return _run(args)


def _add_run_options(parser: argparse.ArgumentParser, *, demo: bool = False) -> None:
    # Defaults None: the episode settings' defaults are EpisodeConfig's (harness_gym.config).
    parser.add_argument("--engine", default=None,
                        help="policy: auto (default: SmolLM2 in process), smollm2, tiny, oracle, "
                             "oracle:noop, hf:PATH, "
                             "vllm:URL")
    parser.add_argument("--episode-timeout", type=float, default=None,
                        help="seconds before the CLI is killed (outcome: timeout; default: "
                             "EpisodeConfig.episode_timeout_s)")
    parser.add_argument("--test-timeout", type=float, default=None,
                        help="seconds for the task's tests (default: "
                             "EpisodeConfig.test_timeout_s)")
    parser.add_argument("--max-model-calls", type=int, default=None,
                        help="stop the CLI once the policy has answered this many calls and "
                             "grade the tree as it stands (default: no limit)")
    parser.add_argument("--max-tokens", type=int, default=384 if demo else None,
                        help="cap on tokens sampled per model call")
    parser.add_argument("--temperature", type=float, default=0.6 if demo else None)
    parser.add_argument("--out", default="runs", help="directory for the trace files")
    if demo:
        return
    parser.add_argument("--harness", default=None, help="harness plugin name (default: pi)")
    parser.add_argument("--tasks", default="builtin", help="suite: builtin, a directory or JSONL")
    parser.add_argument("--sandbox", default=None,
                        help="sandbox backend: bwrap (default where it works), local, ...")
    parser.add_argument("--episodes", type=int, default=1)
    parser.add_argument("--task-id", action="append", help="run these tasks (repeatable)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quiet", action="store_true")


def _harnesses(args: argparse.Namespace) -> int:
    """List the registered harness plugins, their pinned versions and whether they are installed;
    `--install` installs them all into the shared cache first; `--check` runs the conformance
    check on each installed one (`harness_check`)."""
    from .harness import HarnessError, available_harnesses, load_harness

    failed = 0
    for name in available_harnesses():
        try:
            harness = load_harness(name)
            if args.install:
                harness.install(progress=lambda m: print(f"  {m}", flush=True))
            state = "installed" if harness.is_installed() else "not installed"
            package = harness.package
            spec = f"{package.manager} {package.name}=={package.version}"
            print(f"{name:<14} {spec:<48} {harness.dialect:<19} {state}", flush=True)
            if args.check and harness.is_installed():
                failed += _check_harness(harness)
        except (HarnessError, OSError, ImportError) as exc:
            failed += 1
            print(f"{name:<14} error: {exc}")
    return 1 if failed and (args.install or args.check) else 0


def _check_harness(harness: HarnessSpec) -> int:
    """Print the conformance check's verdict on one installed CLI; 1 if it failed."""
    from .harness_check import check_harness

    problems = check_harness(harness)
    for problem in problems:
        print(f"  check FAILED: {problem}", flush=True)
    if not problems:
        print("  check ok: task text intact, tool call round-trips as one segment, "
              "output cap honoured", flush=True)
    return 1 if problems else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="harness-gym",
        description="Run coding-agent CLIs as RL environments, with token-faithful traces.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    # Also accepted after the subcommand; SUPPRESS keeps it from resetting the global one.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show tracebacks for errors")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", parents=[common],
                                help="run the interception proxy on its own")
    serve.add_argument("--engine", default="tiny", help="engine spec: tiny, smollm2, hf:PATH, ...")
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    serve.add_argument("--port", type=int, default=0, help="port (default: any free port)")
    serve.add_argument(
        "--admin-key", default=None,
        help="key the admin routes (/sessions) require (default: $HARNESS_GYM_ADMIN_KEY). "
             "Without one they are OPEN to every local client when --host is a loopback "
             "address; on any other address a random key is made up and printed at start")
    from .proxy.settings import add_setting_flags

    add_setting_flags(serve)
    serve.set_defaults(handler=_serve)

    harnesses = commands.add_parser(
        "harnesses", parents=[common],
        help="list the registered harness CLIs, their versions, what is installed")
    harnesses.add_argument("--install", action="store_true",
                           help="install every registered harness into the shared cache")
    harnesses.add_argument("--check", action="store_true",
                           help="run each installed CLI against the proxy with a scripted "
                                "policy and check what the environment relies on")
    harnesses.set_defaults(handler=_harnesses)

    run = commands.add_parser("run", parents=[common], help="run episodes and write their traces")
    _add_run_options(run)
    run.set_defaults(handler=_run)

    demo = commands.add_parser(
        "demo", parents=[common],
        help="one real Pi episode with SmolLM2-135M on the CPU (the embedded defaults)")
    _add_run_options(demo, demo=True)
    demo.set_defaults(handler=_demo)

    trace = commands.add_parser(
        "trace", parents=[common], help="show recorded traces (runs JSONL or Parquet)")
    trace.add_argument("files", nargs="*", metavar="FILE",
                       help="runs JSONL from `harness-gym run` or RecordTraces Parquet "
                            "(default: the newest in --runs)")
    trace.add_argument("--runs", default="runs", metavar="DIR",
                       help="where to look for the newest run when no FILE is given")
    trace.add_argument("--episode", type=int, default=None,
                       help="only this episode (numbered across the files; default: all)")
    trace.add_argument("--html", default=None, metavar="OUT.html",
                       help="write a self-contained HTML page instead of printing")
    trace.add_argument("--tokenizer", default=None,
                       help="decode with this instead of each episode's own: tiny, smollm2, "
                            "or a tokenizer directory")
    trace.add_argument("--prompt", action="store_true", help="print each segment's prompt too")
    trace.set_defaults(handler=_trace)

    from .tasks.family.cli import add_tasks_command

    add_tasks_command(commands, parents=[common])
    from .engines.vllm_cli import add_vllm_serve_command

    add_vllm_serve_command(commands, common)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except KeyboardInterrupt:
        _status("harness-gym: interrupted")
        return 130
    except Exception as exc:
        if args.debug or not isinstance(exc, user_errors()):
            raise
        _status(f"harness-gym: error: {exc} (--debug shows the traceback)")
        return 2


def user_errors() -> tuple[type[Exception], ...]:
    """What a user's input can cause (a misspelt name, a missing file, an extra not installed):
    reported in one line. Anything else is a bug, and keeps its traceback."""
    from .engines.base import EngineError
    from .engines.vllm_install import VLLMInstallError
    from .harness import HarnessError
    from .sandbox import SandboxError
    from .tasks.log_parsers import UnknownLogParserError

    return (ValueError, OSError, ImportError, HarnessError, SandboxError, UnknownLogParserError,
            EngineError, VLLMInstallError)


if __name__ == "__main__":
    sys.exit(main())
