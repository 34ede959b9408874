"""The three runs a real-CLI test module looks at, for any harness: an episode, the same CLI
under `strace` (whom it connects to), and a run whose every model call gets a 404.

Each runs the installed CLI headless in a local sandbox against a scripted server of the
harness's own dialect (`ScriptedChatServer` or `ScriptedMessagesServer`) that asks for one
call of the harness's shell tool, then says "done". What differs per CLI is data, a
`ScriptedCLI`; `started` runs the three side by side (`support.parallel.started_together`:
each its own sandbox and server), since each is mostly a CLI start-up.

    CLI = ScriptedCLI(OpenCodeHarness, prompt="Write hello into probe.txt.")
    with started(CLI, CLI.installed()) as runs:
        box, future = runs["episode"]
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from harness_gym.harness import Endpoint, HarnessSpec, harness_cache_dir
from harness_gym.sandbox.local import LocalSandbox

from . import scripted_anthropic, scripted_openai
from .parallel import started_together
from .recording_http import RecordingServer

PROBE = "echo hello > probe.txt"
# dialect -> (the scripted server, its "shell tool, then done" script)
SERVERS: dict[str, tuple[Callable[..., RecordingServer], Callable[[str, str], Any]]] = {
    "openai-chat": (scripted_openai.ScriptedChatServer, scripted_openai.shell_then_done),
    "anthropic-messages": (scripted_anthropic.ScriptedMessagesServer,
                           scripted_anthropic.shell_then_done),
}
Run = dict[str, Any]  # "result" (ExecResult), and "server", "log" where the run has them


@dataclass(frozen=True)
class ScriptedCLI:
    """What a CLI's runs need: its harness class, the episode's prompt, extra `Endpoint`
    fields for the episode, and how long one run may take."""

    harness: Callable[[], HarnessSpec]
    prompt: str
    endpoint: Mapping[str, Any] = field(default_factory=dict)
    timeout_s: float = 120.0

    def server(self, route: str | None = None) -> RecordingServer:
        harness = self.harness()
        server_type, script = SERVERS[harness.dialect]
        routed = {"route": route} if route else {}
        return server_type(script(harness.shell_tool, PROBE), **routed)

    def installed(self) -> Path:
        """The shared harness cache, with the CLI installed there (once per machine): the
        cache the fidelity and limits modules run it from too. A temp cache per module
        installed it once more each time (Hermes: ~30 s of pip)."""
        self.harness().install()
        return harness_cache_dir()


def episode(cli: ScriptedCLI, cache: Path, box: LocalSandbox) -> Run:
    with cli.server() as server:
        endpoint = Endpoint(server.base_url, api_key="session-key-1", model="policy",
                            **cli.endpoint)
        result = cli.harness().launch(box, endpoint, cli.prompt,
                                      cache_dir=cache).wait(timeout=cli.timeout_s)
    return {"result": result, "server": server}


def strace(cli: ScriptedCLI, cache: Path, box: LocalSandbox) -> Run:
    log = box.root / "connect.log"
    with cli.server() as server:
        plan = cli.harness().prepare(box, Endpoint(server.base_url, "key"), "hi",
                                     cache_dir=cache)
        argv = ["strace", "-f", "-qq", "-e", "trace=connect", "-o", str(log), *plan.argv]
        result = box.start(argv, env=plan.env).wait(timeout=cli.timeout_s)
    return {"result": result, "server": server, "log": log.read_text()}


def failed_call(cli: ScriptedCLI, cache: Path, box: LocalSandbox) -> Run:
    with cli.server(route="/missing") as server:  # every model call gets a 404
        result = cli.harness().launch(box, Endpoint(server.base_url, "key"), "hi",
                                      cache_dir=cache).wait(timeout=cli.timeout_s)
    return {"result": result}


RUNS = {"episode": episode, "strace": strace, "failed_call": failed_call}


@contextmanager
def started(cli: ScriptedCLI, cache: Path) -> Iterator[dict[str, tuple[LocalSandbox, Future[Run]]]]:
    """The three runs at once (the strace one where strace is installed); yields, once all have
    ended, name -> (its sandbox, its future). The sandboxes close on exit."""
    wanted = {k: f for k, f in RUNS.items() if k != "strace" or shutil.which("strace")}
    runs = {name: partial(run, cli, cache) for name, run in wanted.items()}
    with started_together(runs) as done:
        yield done


def connect_targets(log: str) -> set[tuple[str, str]]:
    """(port, address) of every AF_INET connect() in an `strace -e trace=connect` log."""
    inet = [line for line in log.splitlines() if "AF_INET" in line]
    return {re.search(r"htons\((\d+)\).*?addr\(\"([^\"]+)\"\)", line).groups() for line in inet}
