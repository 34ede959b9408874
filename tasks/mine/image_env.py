"""A mined task's Python env for a docker image: a venv of the image's own interpreter.

bwrap and local run a mined task's tests with a venv of the host's interpreter (`envs`); a
container cannot (its /usr is the image's, the host's interpreter is not there). For `docker`
the env is made for the image instead, offline, since containers have no network:

1. `probe(image)`: the image's Python (version, glibc, machine) from a throwaway container;
2. on the host, `pip download --only-binary=:all:` fetches the requirements as wheels for
   exactly those tags; a dependency without such a wheel falls back to `pip wheel` here, which
   turns a pure-Python sdist into a wheel any Python 3 installs;
3. in a container of the image, no network, the env's folder bind-mounted at its cache path:
   `python3 -m venv` (its pip comes from ensurepip, offline) and
   `pip install --no-index --find-links <the wheels>`; the wheels are deleted after.

Build containers carry the sandbox backend's owner labels, so one left by a killed miner is
reaped like a sandbox's.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ImageEnvError", "ImagePython", "build_image_env", "image_id", "probe"]

BUILD_TIMEOUT_S = 900
_PROBE = ("import json, platform, sys; print(json.dumps({'version': platform.python_version(), "
          "'libc': list(platform.libc_ver()), 'machine': platform.machine()}))")  # fmt: skip
_INSTALL = r"""
set -e
env=$1 wheels=$2; shift 2
python3 -m venv "$env"
"$env/bin/python" -m pip install --quiet --no-index --no-cache-dir --disable-pip-version-check \
  --find-links "$wheels" "$@"
"""


class ImageEnvError(RuntimeError):
    """The image's env could not be built (no python3 in it, a wheel missing, pip failed)."""


@dataclass(frozen=True)
class ImagePython:
    image: str
    image_id: str
    version: str  # "3.11.2"
    glibc: str | None  # "2.36", None on musl or unknown
    machine: str  # "x86_64"

    def pip_target(self) -> list[str]:
        """`pip download` options that select wheels this interpreter installs."""
        major, minor = self.version.split(".")[:2]
        abi = f"cp{major}{minor}"
        options = ["--only-binary=:all:", "--python-version", f"{major}.{minor}",
                   "--implementation", "cp"]
        options += [arg for tag in (abi, "abi3", "none") for arg in ("--abi", tag)]
        # pip 23 does not widen manylinux_2_N to older N: list every glibc a wheel may target.
        platforms = [f"linux_{self.machine}"]
        if self.glibc:
            top = int(self.glibc.split(".")[1])
            platforms += [f"manylinux_2_{n}_{self.machine}" for n in range(top, 4, -1)]
            platforms += [f"manylinux{tag}_{self.machine}" for tag in ("2014", "2010", "1")]
        for name in platforms:
            options += ["--platform", name]
        return options


def _client() -> Any:
    from ...sandbox.docker import _docker

    return _docker().from_env(timeout=60)


def image_id(image: str) -> str:
    """The image's id (`sha256:...`): what an env built for it is keyed and checked by."""
    from ...sandbox.docker import _docker

    client = _client()
    try:
        return str(client.images.get(image).id)
    except _docker().errors.ImageNotFound:
        raise ImageEnvError(f"docker image {image} is missing: build it with scripts/docker-image")
    finally:
        client.close()


def _run(image: str, command: list[str], mounts: dict[str, str] | None = None) -> str:
    """Run `command` in a fresh, network-less container of `image`; its output (raises on a
    non-zero exit)."""
    from ...sandbox._containers import owner_labels
    from ...sandbox.docker import _docker

    client = _client()
    container = None
    try:
        container = client.containers.run(
            image, command, detach=True, network_mode="none", user=f"{os.getuid()}:{os.getgid()}",
            environment={"HOME": "/tmp", "PYTHONDONTWRITEBYTECODE": "1"},
            labels={**owner_labels(), "harness-gym.sandbox.label": "mine-env"},
            volumes={h: {"bind": c, "mode": "rw"} for h, c in (mounts or {}).items()},
        )  # fmt: skip
        try:
            code = int(container.wait(timeout=BUILD_TIMEOUT_S)["StatusCode"])
        except Exception as exc:  # the SDK raises the transport's own timeout error
            raise ImageEnvError(f"{command[0]} in {image} ran past {BUILD_TIMEOUT_S}s: {exc}")
        output = container.logs().decode(errors="replace")
        if code != 0:
            raise ImageEnvError(f"{' '.join(command[:3])} failed in {image}: {output[-1500:]}")
        return output
    except _docker().errors.DockerException as exc:
        raise ImageEnvError(f"docker could not run {command[0]} in {image}: {exc}") from None
    finally:
        if container is not None:
            try:
                container.remove(force=True)
            except _docker().errors.NotFound:
                pass  # removed already (a reaper)
        client.close()


def probe(image: str) -> ImagePython:
    """What Python `image` holds (python3 on its PATH)."""
    found = json.loads(_run(image, ["python3", "-c", _PROBE]).strip().splitlines()[-1])
    libc, libc_version = found["libc"]
    return ImagePython(image, image_id(image), found["version"],
                       libc_version if libc == "glibc" else None, found["machine"])  # fmt: skip


def _wheels(python: ImagePython, requirements: list[str], dest: Path) -> None:
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    download = [*pip, "download", "-d", str(dest), *python.pip_target(), *requirements]
    done = subprocess.run(download, capture_output=True, text=True, check=False,
                          timeout=BUILD_TIMEOUT_S)  # fmt: skip
    if done.returncode == 0:
        return
    same_python = python.version.split(".")[:2] == platform.python_version().split(".")[:2]
    wheel = subprocess.run([*pip, "wheel", "-w", str(dest), *requirements], capture_output=True,
                           text=True, check=False, timeout=BUILD_TIMEOUT_S)  # fmt: skip
    if wheel.returncode != 0:
        raise ImageEnvError(
            f"no wheels of {' '.join(requirements)} for {python.image}'s Python {python.version}"
            f" ({done.stderr.strip()[-600:]}), and pip wheel failed too: "
            f"{wheel.stderr.strip()[-600:]}"
        )
    if not same_python:
        print(f"harness-gym: some wheels for {python.image} were built with this host's Python "
              f"{platform.python_version()}: compiled ones may not install there", file=sys.stderr)


def build_image_env(out: Path, python: ImagePython, requirements: list[str]) -> None:
    """Make `out` a venv of `python.image`'s interpreter holding `requirements`."""
    wheels = out / ".wheels"
    wheels.mkdir()
    _wheels(python, requirements, wheels)
    try:
        _run(python.image, ["sh", "-c", _INSTALL, "install", str(out), str(wheels),
                            *requirements], mounts={str(out): str(out)})  # fmt: skip
    finally:
        shutil.rmtree(wheels, ignore_errors=True)
