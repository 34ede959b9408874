"""`InterceptionProxy`: the proxy as a Python object, serving on loopback from its own thread.

    >>> import openai
    >>> from harness_gym.proxy import InterceptionProxy
    >>> with InterceptionProxy("tiny") as proxy:
    ...     session = proxy.open_session(sampling={"max_tokens": 4})
    ...     client = openai.OpenAI(base_url=proxy.base_url, api_key=session.session_id)
    ...     answer = client.chat.completions.create(
    ...         model="tiny", messages=[{"role": "user", "content": "Hello"}])
    ...     trace = session.trace_json()
    >>> (segment,) = trace["segments"]
    >>> len(segment["response_ids"]) == answer.usage.completion_tokens <= 4
    True

The socket is bound before the server thread starts (port 0 picks a free port), so `base_url`
is known at once and no caller races the server's start-up.

The admin routes need an admin key: pass one, or a random one is made (`admin_key`); Python
callers open and close sessions through the object and never need it. `open_admin=True` (what
`harness-gym serve` does on loopback when given no key, as the public contract allows) leaves
them open to local clients that send no session key. Connections are
guarded (`connections.py`: read deadlines, a connection cap) and the process's soft open-file
limit is raised towards 65,536 at start, so the cap, not the file limit, decides who gets in,
and the interpreter's GIL switch interval is lowered to `gil_switch_interval_s` (both are
process-wide: the proxy serves from a thread of its host's process).
"""

from __future__ import annotations

import asyncio
import ipaddress
import secrets
import socket
import sys
import threading
from typing import Any

import uvicorn

from ..engines import Engine, load_engine
from .app import ProxyApp
from .connections import ConnectionGuard, raise_open_file_limit
from .errors import ProxyError
from .rendering import PromptRenderer
from .sessions import ProxySession, SessionRegistry
from .settings import ProxySettings

_FILES_KEPT_FOR_THE_REST = 256  # descriptors the connection cap leaves to sandboxes, logs...


def _new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop  # a faster loop where installed (it is a dependency on Linux)
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


class InterceptionProxy:
    def __init__(
        self,
        engine: Engine | str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        admin_key: str | None = None,
        open_admin: bool = False,
        settings: ProxySettings | None = None,
    ) -> None:
        if open_admin and (admin_key or not is_loopback(host)):
            raise ValueError("open_admin=True leaves /sessions open to every local client: it "
                             "takes no admin_key and binds only a loopback host")
        self.engine = load_engine(engine)
        self.settings = settings or ProxySettings()
        self.admin_key: str | None = (
            None if open_admin else admin_key or "hga-" + secrets.token_urlsafe(24)
        )
        self.renderer = PromptRenderer(self.engine.tokenizer, self.engine.stop_token_ids,
                                       multimodal=self.engine.accepts_images)
        self.sessions = SessionRegistry(
            self.renderer, max_sessions=self.settings.max_sessions,
            idle_timeout_s=self.settings.session_idle_timeout_s,
        )
        self._socket = socket.socket(
            socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM
        )
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))
        self.host, self.port = host, self._socket.getsockname()[1]
        shown_host = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown_host}:{self.port}"
        self.base_url = self.url + "/v1"
        self.app = ProxyApp(
            self.engine, self.sessions, settings=self.settings, admin_key=self.admin_key,
            base_url=self.base_url,
        )
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> InterceptionProxy:
        if self._thread is not None:
            return self
        if sys.getswitchinterval() > self.settings.gil_switch_interval_s:
            # A worker thread parsing a large request holds the GIL for a whole interval at a
            # time, and the event loop and the engine's decode thread wait that long for each
            # of their many short turns: at 5 ms, another session's call ran 2.7x slower
            # during 8 MB requests, at 1 ms 1.75x (measured on 2 busy cores).
            sys.setswitchinterval(self.settings.gil_switch_interval_s)
        files = raise_open_file_limit()
        settings = self.settings
        guard = ConnectionGuard(
            header_timeout_s=settings.header_timeout_s,
            body_timeout_s=settings.body_timeout_s,
            max_connections=max(16, min(settings.max_connections,
                                        files - _FILES_KEPT_FOR_THE_REST)),
            # A refused body is read and dropped up to this, so its sender still gets the 413.
            max_discard_bytes=max(4 * settings.max_body_bytes, 64 * 1024 * 1024),
        )
        config = uvicorn.Config(
            self.app.asgi, log_level="warning", lifespan="off", access_log=False,
            timeout_graceful_shutdown=2, http=guard.protocol_factory(),
        )
        self._server = uvicorn.Server(config)
        started = threading.Event()
        failure: list[BaseException] = []

        def serve() -> None:
            loop = _new_event_loop()
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._serve(started))
            except BaseException as exc:  # surfaced to start()'s caller
                failure.append(exc)
                started.set()
            finally:
                loop.close()

        self._thread = threading.Thread(target=serve, name="harness-gym-proxy", daemon=True)
        self._thread.start()
        started.wait(30)
        if failure or not started.is_set():
            raise RuntimeError(f"the proxy failed to start: {failure[0] if failure else 'timeout'}")
        return self

    async def _serve(self, started: threading.Event) -> None:
        assert self._server is not None
        self._socket.listen(2048)
        serve = asyncio.ensure_future(self._server.serve(sockets=[self._socket]))
        while not self._server.started and not serve.done():
            await asyncio.sleep(0.005)
        started.set()
        try:
            await serve
        finally:  # the engine's resources on this loop (its HTTP client) go before the loop
            release = getattr(self.engine, "release_loop", None)
            if release is not None:
                await release()

    def open_session(
        self,
        policy_version: int | None = None,
        sampling: dict[str, Any] | None = None,
        context_overflow: str = "error",
        train_subagents: bool = False,
        max_calls: int | None = None,
    ) -> ProxySession:
        """`max_calls`: the session refuses calls once the policy has answered that many
        (`SessionTrace.call_limit_refusals` counts the refused)."""
        return self.sessions.open(policy_version, sampling, context_overflow, train_subagents,
                                  max_calls)

    def close_session(self, session_id: str) -> ProxySession | None:
        """End a session (calls still running record nothing more). Idempotent: a session
        that already ended (closed, or expired while idle) gives None, never an error."""
        try:
            return self.sessions.close(session_id)
        except ProxyError:
            return None

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)
        self._thread = None
        self._socket.close()

    def __enter__(self) -> InterceptionProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
