"""A training run's checkpoint on disk: `output_dir/checkpoint-<step>/`, written whole or not at
all, so a run killed mid-save resumes from the checkpoint before.

Files (the `Trainer` names where there is one): `model.pt` (the model's `state_dict`),
`optimizer.pt`, `scheduler.pt`, `rng_state.pth` (torch's CPU and CUDA generators) and
`trainer_state.json` (the step, the policy version, counters, the log, the rollout worker's
state, Python's RNG). Tensors load with `weights_only=True`: a checkpoint is data, not code.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

__all__ = ["latest_checkpoint", "read_checkpoint", "write_checkpoint"]

_NAME = re.compile(r"^checkpoint-(\d+)$")
_TENSOR_FILES = ("model", "optimizer", "scheduler", "rng_state")
_SUFFIX = {"rng_state": ".pth"}


def write_checkpoint(
    output_dir: str | os.PathLike[str], step: int, tensors: dict[str, Any],
    state: dict[str, Any], *, keep: int | None = None,
) -> Path:
    """Write `checkpoint-<step>` under `output_dir` (a temporary sibling renamed into place),
    keeping the newest `keep` checkpoints (None: all). Answers its path."""
    root = Path(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"checkpoint-{step}"
    staging = Path(tempfile.mkdtemp(prefix=f".checkpoint-{step}-", dir=root))
    try:
        for name in _TENSOR_FILES:
            torch.save(tensors[name], staging / f"{name}{_SUFFIX.get(name, '.pt')}")
        (staging / "trainer_state.json").write_text(json.dumps(state))
        if final.exists():  # the same step saved again (a resumed run): the new one wins
            shutil.rmtree(final)
        os.replace(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if keep is not None:
        for old in _checkpoints(root)[:-keep or None]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def read_checkpoint(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The tensors and the state `write_checkpoint` wrote, or a one-line `FileNotFoundError`."""
    path = Path(path)
    if not (path / "trainer_state.json").is_file():
        raise FileNotFoundError(f"{path} is not a checkpoint (no trainer_state.json in it)")
    tensors = {name: torch.load(path / f"{name}{_SUFFIX.get(name, '.pt')}", weights_only=True)
               for name in _TENSOR_FILES}
    return tensors, json.loads((path / "trainer_state.json").read_text())


def latest_checkpoint(output_dir: str | os.PathLike[str]) -> Path | None:
    """The highest-step `checkpoint-<step>` under `output_dir`, or None."""
    found = _checkpoints(Path(output_dir))
    return found[-1] if found else None


def _checkpoints(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]
