"""The byte relay that lets a sandbox with no network reach the proxy on the host.

On the host, a relay listens on a unix socket in a directory bind-mounted into the sandbox
and forwards to the proxy's TCP port, and nowhere else; inside, the same script listens on
127.0.0.1:PORT and forwards to that socket. The sandbox keeps a network of its own (docker's
`network_mode="none"`, bwrap's `--unshare-net`): nothing but the proxy is reachable, and the
proxy needs no change. What the relay exposes is the proxy's whole HTTP surface; its admin
routes are closed to session keys by the admin key the env's proxy always has.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .base import SandboxError

# A byte relay, run both on the host (unix socket -> the proxy's TCP port) and in the container
# (127.0.0.1:port -> the unix socket). Addresses: unix:/path or tcp:host:port. With --fork it
# returns once listening and serves from a child (the in-container exec returns when ready);
# without, it prints "ready" and exits when its stdin closes (the host relay: killed at close,
# and gone with its owner when a SIGKILL leaves no chance to close).
RELAY_SCRIPT = r"""
import os, socket, sys, threading
def addr(a):
    kind, _, rest = a.partition(":")
    if kind == "unix":  # by name from its dir: a deep dir (a Ray node's) passes the 108-byte limit
        where, _, name = rest.rpartition("/")
        if where:
            os.chdir(where)
        return socket.AF_UNIX, name
    host, _, port = rest.rpartition(":")
    return socket.AF_INET, (host, int(port))
(lfam, laddr), (cfam, caddr) = addr(sys.argv[1]), addr(sys.argv[2])
srv = socket.socket(lfam)
if lfam == socket.AF_INET:
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(laddr)
srv.listen(256)
if "--fork" in sys.argv:
    if os.fork():
        os._exit(0)
    os.setsid()
else:
    print("ready", flush=True)
    def orphaned():  # the host relay ends with its owner: stdin closes when the owner dies
        sys.stdin.buffer.read()
        os._exit(0)
    threading.Thread(target=orphaned, daemon=True).start()
def pump(a, b):
    buf = bytearray(1 << 18)  # one buffer per direction: a request body moves in few syscalls
    view = memoryview(buf)
    try:
        while n := a.recv_into(buf):
            b.sendall(view[:n])
    except OSError:
        pass
    try:
        b.shutdown(socket.SHUT_WR)
    except OSError:
        pass
def nodelay(s):  # forward each chunk at once: Nagle would hold an SSE event back ~40 ms
    if s.family == socket.AF_INET:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
def serve(c):
    u = socket.socket(cfam)
    try:
        u.connect(caddr)
    except OSError:
        c.close()
        return
    nodelay(c)
    nodelay(u)
    t = threading.Thread(target=pump, args=(u, c), daemon=True)
    t.start()
    pump(c, u)
    t.join()
    c.close()
    u.close()
while True:
    c, _ = srv.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""


def start_host_relay(socket_path: Path, host: str, port: int) -> subprocess.Popen[bytes]:
    """Serve `socket_path`, forwarding to `host:port`; returns once it listens."""
    relay = subprocess.Popen(
        [sys.executable, "-c", RELAY_SCRIPT, f"unix:{socket_path}", f"tcp:{host}:{port}"],
        stdout=subprocess.PIPE,
        stdin=subprocess.PIPE,  # never written: its EOF tells the relay we are gone
        start_new_session=True,
    )
    assert relay.stdout is not None
    if relay.stdout.readline().strip() != b"ready":
        stop_relay(relay)
        raise SandboxError(f"could not relay {socket_path} to {host}:{port}")
    return relay


def stop_relay(relay: subprocess.Popen[bytes]) -> None:
    relay.kill()
    relay.communicate()  # reaps it and closes its pipes
