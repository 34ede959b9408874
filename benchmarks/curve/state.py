"""The run's state in git: what a fresh machine needs to resume a run, small enough to commit.

Why: the full run needs ~10 h of this machine, every working session gets a fresh one, and only
what is committed survives. A LoRA run's checkpoints are adapters (a few MB, with the adapter's
optimizer state), so the whole workdir but its local derivatives fits: `RunState.save` mirrors
the workdir into the state folder (a committed folder such as
`benchmarks/results/learning_curve_state/full/`) after each stage and each trainer checkpoint,
and `RunState.restore` copies what the workdir lacks back from it before a run resumes.

Left out: merged full weights (`.merged/`, made again from the adapters when needed), the base
model's tokenizer files (a trainer writes them into every checkpoint; LoRA never changes them),
peft's model cards (`README.md`, 5 KB beside each adapter), temporary files and directories,
`run.pid`. JSON and JSON Lines files (traces, GRPO journals) are stored gzip-compressed, except
each stage's `metrics.json` and the run's `config.json` (readable in a diff).
Compression is deterministic and unchanged files are not rewritten, so a commit of the state
holds only what changed.

A run whose configuration changed since its state was saved is taken up only where the change
touches no stage it has begun (`reconcile`): e.g. new SFT settings keep the demonstrations, and
`--redo-changed` removes the SFT stage and those after it to run them again. What a removed stage
had cost stays on the books: `discarded.json` (`DISCARDED`) lists each one, its wall and CPU
seconds (a stage cut before its end: the span of its files' times, a lower bound), so the run's
time against its budget counts the work thrown away too.

A stage cut at a session's end and resumed in the next spends time in each sitting: each cut
sitting adds its wall and CPU seconds to the stage's `sittings.json` (`record_sitting`), and the
stage's metrics count them all when it ends (`earlier_sittings`).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config import recorded_differences, stale_stages
from .process import log

#: A file larger than this is refused: a full-weight checkpoint (540 MB for SmolLM2) has no
#: place in git, and no file of a LoRA run comes near it.
MAX_FILE_BYTES = 40 << 20
DISCARDED = "discarded.json"  # the ledger of removed stages (module docstring)
SITTINGS = "sittings.json"  # a stage's cut sittings (module docstring)
PLAIN = {"metrics.json", "config.json", DISCARDED, SITTINGS}
COMPRESSED_SUFFIXES = {".json", ".jsonl"}
TOKENIZER_FILES = {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                   "special_tokens_map.json", "vocab.json", "merges.txt", "added_tokens.json"}
LOCAL_ONLY = {"run.pid", "README.md"}  # README.md: the model card peft writes by an adapter


class StateError(SystemExit):
    """A state folder that cannot take this run (another run's, or a file too large for git)."""


@dataclass
class SaveStats:
    files: int = 0
    bytes: int = 0
    written: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)


class RunState:
    """The state folder `directory` of the run in `workdir` (see the module docstring)."""

    def __init__(self, directory: Path, workdir: Path) -> None:
        self.directory = directory
        self.workdir = workdir

    def check(self, config: dict[str, Any], *, redo_changed: bool = False) -> list[str]:
        """Refuse a folder that holds files but no run, or a run whose recorded configuration
        `config` changes in stages it has begun (see `reconcile`): saving mirrors the workdir
        into it (removing what the workdir no longer has). Returns the stages removed."""
        if recorded_differences(self.directory, config) is None and self.directory.is_dir() \
                and any(self.directory.iterdir()):
            raise StateError(f"{self.directory} is not a learning-curve state (no config.json): "
                             "give an empty or new folder")
        return reconcile(self.directory, config, redo_changed=redo_changed)

    def restore(self) -> int:
        """Copy into the workdir each state file it lacks (decompressed); returns the count.
        Files the workdir has are its own, newer than the state's."""
        copied = 0
        for stored in sorted(self._files(self.directory)):
            rel = stored.relative_to(self.directory)
            if rel.name.startswith("."):
                continue  # a write cut short
            target = self.workdir / (rel.with_suffix("") if rel.suffix == ".gz" else rel)
            if target.exists():
                continue
            data = stored.read_bytes()
            _write(target, gzip.decompress(data) if rel.suffix == ".gz" else data,
                   stored.stat().st_mtime_ns)
            copied += 1
        if copied:
            log(f"state: {copied} files restored from {self.directory} into {self.workdir}")
        return copied

    def save(self) -> SaveStats:
        """Mirror the workdir's state files into the folder (see the module docstring)."""
        stats = SaveStats()
        wanted = dict(self._exported())
        for rel, source in wanted.items():
            stored = self.directory / rel
            mtime = source.stat().st_mtime_ns
            if not (stored.exists() and stored.stat().st_mtime_ns == mtime):
                data = source.read_bytes()
                if rel.endswith(".gz"):
                    data = gzip.compress(data, compresslevel=9, mtime=0)
                if len(data) > MAX_FILE_BYTES:
                    raise StateError(f"{source} is {len(data) / 2**20:.0f} MB, too large for the "
                                     "state in git (a full-weight checkpoint? set lora_rank)")
                _write(stored, data, mtime)
                stats.written.append(rel)
            stats.files += 1
            stats.bytes += stored.stat().st_size
        for stored in list(self._files(self.directory)):
            rel = stored.relative_to(self.directory).as_posix()
            if rel not in wanted:  # e.g. a trainer checkpoint the trainer has since rotated out
                stored.unlink()
                stats.removed.append(rel)
        for folder in sorted(self.directory.rglob("*"), reverse=True):
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        if stats.written or stats.removed:
            log(f"state: {len(stats.written)} files written, {len(stats.removed)} removed; "
                f"{stats.files} files, {stats.bytes / 2**20:.2f} MB in {self.directory}")
        return stats

    def bytes_by_stage(self) -> dict[str, int]:
        """The folder's bytes per top-level entry (a stage, or `config.json`)."""
        sizes: dict[str, int] = {}
        for stored in self._files(self.directory):
            top = stored.relative_to(self.directory).parts[0]
            sizes[top] = sizes.get(top, 0) + stored.stat().st_size
        return dict(sorted(sizes.items()))

    def callback(self) -> Any:
        """A `TrainerCallback` saving the state after each trainer checkpoint (its adapter,
        the adapter's optimizer state, scheduler, RNG and trainer state)."""
        from transformers import TrainerCallback

        state = self

        class _SaveState(TrainerCallback):
            def on_save(self, args: Any, trainer_state: Any, control: Any, **kw: Any) -> None:
                state.save()

        return _SaveState()

    def _exported(self) -> list[tuple[str, Path]]:
        """(name in the state folder, workdir file) of every file the state keeps."""
        out = []
        for source in sorted(self._files(self.workdir)):
            rel = source.relative_to(self.workdir)
            if any(p.startswith((".", "tmp-")) or p.endswith(".tmp") for p in rel.parts) \
                    or rel.name in TOKENIZER_FILES | LOCAL_ONLY:
                continue
            name = rel.as_posix()
            if rel.suffix in COMPRESSED_SUFFIXES and rel.name not in PLAIN:
                name += ".gz"
            out.append((name, source))
        return out

    @staticmethod
    def _files(root: Path) -> list[Path]:
        return [p for p in root.rglob("*") if p.is_file()] if root.is_dir() else []


def reconcile(folder: Path, config: dict[str, Any], *, redo_changed: bool = False) -> list[str]:
    """Make `config` the configuration of the run recorded in `folder` (a workdir or a state
    folder), or refuse. Stages before the first one a changed field affects are kept (e.g. the
    demonstrations when only SFT's settings change); the stages from it on must not have begun,
    or, with `redo_changed`, they are removed to be run again. Returns the stages removed.
    Idempotent: once config.json records `config`, a resumed run finds nothing to redo."""
    changed = recorded_differences(folder, config)
    if not changed:
        return []
    begun = [stage for stage in stale_stages(changed) if RunState._files(folder / stage)]
    if begun and not redo_changed:
        raise StateError(
            f"{folder} holds a run with another configuration (differs in {', '.join(changed)}) "
            f"that changes stages it has begun ({', '.join(begun)}): resume it with the same "
            "settings, pass --redo-changed to run those stages again under these (the stages "
            "before them are kept), or give another folder")
    recorded = (folder / "config.json").read_bytes()
    for stage in begun:
        record_discarded(folder, stage, changed, recorded)
        shutil.rmtree(folder / stage)
    _write(folder / "config.json", json.dumps(config, indent=2).encode(), time.time_ns())
    log(f"{folder}: configuration changed in {', '.join(changed)}; "
        + (f"stages {', '.join(begun)} removed, to run again" if begun
           else "no stage it changes had begun"))
    return begun


def discarded(folder: Path) -> list[dict[str, Any]]:
    """The removed stages recorded in `folder` (a workdir or a state folder)."""
    path = folder / DISCARDED
    return json.loads(path.read_text()) if path.is_file() else []


def record_discarded(folder: Path, stage: str, changed: list[str], recorded: bytes) -> None:
    """Add `stage` of `folder`, about to be removed, to its ledger: once per run of it (a stage
    of one configuration is removed from the state folder and from the workdir alike)."""
    entry: dict[str, Any] = {
        "stage": stage, "config_sha256": hashlib.sha256(recorded).hexdigest()[:16],
        "changed": changed, "removed": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    metrics = folder / stage / "metrics.json"
    if metrics.is_file():
        done = json.loads(metrics.read_text())
        entry.update(complete=True, wall_s=done.get("wall_s"), cpu_s=done.get("cpu_s"))
    else:  # cut: its sittings, or from its first file to its last one (a lower bound)
        times = [p.stat().st_mtime for p in RunState._files(folder / stage)]
        sittings = earlier_sittings(folder / stage)
        span = max(times) - min(times) if times else 0.0
        entry.update(complete=False,
                     wall_s=max(span, sum(s["wall_s"] for s in sittings)),
                     cpu_s=sum(s["cpu_s"] or 0.0 for s in sittings) if sittings else None)
    ledger = discarded(folder)
    if any((e["stage"], e["config_sha256"]) == (stage, entry["config_sha256"]) for e in ledger):
        return
    _write(folder / DISCARDED, json.dumps([*ledger, entry], indent=2).encode(), time.time_ns())


def earlier_sittings(stage_dir: Path) -> list[dict[str, Any]]:
    """The cut sittings `record_sitting` recorded for a stage, oldest first."""
    path = stage_dir / SITTINGS
    return json.loads(path.read_text()) if path.is_file() else []


def record_sitting(stage_dir: Path, wall_s: float, cpu_s: float, server_cpu_s: float) -> None:
    """Add a sitting in which the stage was cut to its `sittings.json`."""
    entry = {"wall_s": wall_s, "cpu_s": cpu_s, "server_cpu_s": server_cpu_s,
             "ended": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    _write(stage_dir / SITTINGS,
           json.dumps([*earlier_sittings(stage_dir), entry], indent=2).encode(), time.time_ns())


def _write(path: Path, data: bytes, mtime_ns: int) -> None:
    """Whole or absent, with the given modification time (an unchanged file is recognised by
    it, so it is neither compressed nor written again)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.utime(tmp, ns=(mtime_ns, mtime_ns))
    tmp.replace(path)
