"""The shell side of a remote sandbox: the scripts the `e2b` and `hf` backends send.

The command wrapper (output to files, exit codes that survive a killed wrapper), the kill of
every process carrying a job's marker (which catches `setsid` escapees), the per-rollout layout
(`work/`, `home/`, `tmp/`, `logs/` under one `mktemp -d`), the repo tarball, and the mapping of
the proxy's local URL to the public URL a cloud sandbox must use.
"""

from __future__ import annotations

import io
import shlex
import tarfile
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from .base import SandboxError

KILLED_EXIT_CODE = 137  # what our wrapper shell reports for a SIGKILLed command


def inner_command(command: Sequence[str] | str) -> str:
    """The user's command as one shell word list: a str runs under its own `bash -c`, so that
    `$$`, `exit` and `kill -9 $$` act on it, not on our wrapper."""
    if isinstance(command, str):
        return shlex.join(["bash", "-c", command])
    return shlex.join(list(command))


def exec_script(command: Sequence[str] | str, out: str, err: str, stdin: str) -> str:
    """Run `command` with its output in files, then print them and exit with its code.

    Output goes to files, not the SDK's pipes: a `cmd &` left behind would hold the pipes open
    and the call would not return although the command has exited. Not `exec`: the wrapper
    stays the parent, so a signal death reads as 128+n (137 for SIGKILL), as under bwrap.
    """
    q = shlex.quote
    return (
        f"{{ {inner_command(command)} ; }} > {q(out)} 2> {q(err)} < {q(stdin)}; code=$?; "
        f"cat {q(out)}; cat {q(err)} >&2; rm -f {q(out)} {q(err)}; exit $code"
    )


def job_script(command: Sequence[str] | str, out: str, err: str, exit_path: str) -> str:
    """Run `command` with its output in files and its exit code in `exit_path`: both SDKs may
    forget a finished process (HF lists a bounded number; E2B's envd drops it once it ended)."""
    q = shlex.quote
    return (
        f'mkdir -p "$(dirname {q(out)})" && '
        f"{{ {inner_command(command)} ; }} > {q(out)} 2> {q(err)} < /dev/null; code=$?; "
        f"echo $code > {q(exit_path)}; exit $code"
    )


def kill_marked_script(var: str, value: str, rounds: int = 50) -> str:
    """Kill every process in the sandbox whose environment holds `var=value`, until none is
    left: the remote twin of `_processes.kill_marked` (setsid escapees leave the process group
    the SDK's kill reaches, but keep our markers)."""
    pattern = shlex.quote(f"{var}={value}")
    return (
        f"for i in $(seq {rounds}); do "
        f"pids=$(grep -slzxF {pattern} /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3); "
        '[ -z "$pids" ] && break; kill -9 $pids 2>/dev/null; sleep 0.01; done; true'
    )


LAYOUT_SCRIPT = (
    "root=$(mktemp -d -t harness-gym-XXXXXX) && mkdir -p $root/work $root/home $root/tmp "
    '$root/logs && echo "$root"'
)


def repo_tarball(repo: Path) -> bytes:
    """The repo, .git and symlinks included, as one gzipped tar: one upload, not one per file."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as tar:
        tar.add(repo, arcname=".")
    return buffer.getvalue()


def untar_script(tarball: str, workdir: str) -> str:
    q = shlex.quote
    return f"tar -xzf {q(tarball)} -C {q(workdir)} --no-same-owner && rm -f {q(tarball)}"


def public_base_url(proxy_public_url: str | None, local_url: str, backend: str) -> str:
    """`local_url` (the proxy's loopback URL) with its scheme and host replaced by the public
    URL the user exposed the proxy at."""
    if not proxy_public_url:
        raise SandboxError(
            f"the {backend} sandbox runs in the cloud and cannot reach the proxy at {local_url}:"
            f" expose the proxy at a public URL and pass it as proxy_public_url=..."
        )
    public, local = urlsplit(proxy_public_url), urlsplit(local_url)
    path = public.path.rstrip("/") + local.path
    return urlunsplit((public.scheme, public.netloc, path, local.query, ""))
