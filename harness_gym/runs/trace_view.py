"""Reading recorded traces as text: `harness-gym trace [FILE ...] [--episode N] [--html OUT]`.

A trace is token ids; to check what a policy was trained on, a person needs the words, and needs
to see which of them the model sampled (loss_mask 1, coloured by their logprob: p_old) and which
the proxy inserted (tool results, user turns: loss_mask 0, dimmed). A FILE is a run's JSON Lines
(`harness-gym run`, one episode a line) or a Parquet file from `wrappers.RecordTraces`; with no
FILE, the newest run in `runs/`.

Ids are decoded with the tokenizer the episode records (`info["tokenizer"]`, a spec such as
`tiny` or a local directory): SmolLM2's ids read through the tiny tokenizer are gibberish.
Sampled tokens are decoded incrementally, so a character split across byte-level tokens shows
on the token that completes it; the counts and ids are exact. From Python::

    episodes = load_runs(["runs/episodes-20260101-120000.jsonl"])  # what `run` wrote
    print_terminal(episodes, Tokenizers())
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..proxy.detokenize import IncrementalDetokenizer
from ..trace import normalize_segment

# p_old buckets for colouring sampled tokens: (lower bound on p, css class, terminal style).
LOGPROB_BUCKETS = (
    (0.5, "lp-high", "green"),
    (0.1, "lp-mid", "yellow"),
    (0.0, "lp-low", "red"),
)
FALLBACK_TOKENIZER = "tiny"
RUN_PATTERNS = ("episodes-*.jsonl", "*.parquet")


class TraceFileError(ValueError):
    """A trace file (or the runs folder) cannot be read: missing, empty, or not a trace."""


@dataclass(frozen=True)
class Episode:
    """One recorded episode: `number` is its position among all the files shown; `source` the
    file it came from (None for an env's `info` in memory)."""

    number: int
    source: Path | None
    data: dict[str, Any]

    @property
    def segments(self) -> list[dict[str, Any]]:
        return list(self.data.get("trace") or [])


@dataclass(frozen=True)
class Span:
    """A run of response tokens with the same loss mask."""

    sampled: bool
    token_ids: list[int]
    logprobs: list[float]


# --- files ----------------------------------------------------------------------------------


def newest_run(directory: str | Path = "runs") -> Path:
    """The most recently written trace file in `directory` (what `run`/`demo` just wrote)."""
    directory = Path(directory)
    found = [p for pattern in RUN_PATTERNS for p in directory.glob(pattern) if p.is_file()]
    if not found:
        raise TraceFileError(
            f"no trace files in {directory}/: run `harness-gym demo` or `harness-gym run` first, "
            "or name a file"
        )
    return max(found, key=lambda p: (p.stat().st_mtime, p.name))


def load_episodes(path: str | Path) -> list[dict[str, Any]]:
    """Episodes (dicts with a `trace` list of segments) from a runs JSONL or a Parquet file;
    each segment has exactly `SEGMENT_SCHEMA`'s fields."""
    episodes = _read_episodes(Path(path))
    for episode in episodes:
        episode["trace"] = [normalize_segment(s) for s in episode.get("trace") or []]
    return episodes


def _read_episodes(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise TraceFileError(f"no trace file at {path}")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    episodes = []
    with path.open() as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                episodes.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise TraceFileError(f"{path}:{number} is not a JSON line: {exc}") from None
    return episodes


def load_runs(paths: Sequence[str | Path]) -> list[Episode]:
    """Every episode of every file, numbered in order across the files."""
    loaded = [(Path(p), e) for p in paths for e in load_episodes(p)]
    return [Episode(n, source, data) for n, (source, data) in enumerate(loaded)]


def episodes_from_infos(infos: dict[str, Any] | Sequence[dict[str, Any]],
                        rewards: Sequence[float] | None = None) -> list[Episode]:
    """Episodes from `step()` infos in memory: a list of `info` dicts, or a vector env's infos
    (a dict of per-env arrays); `rewards` adds each episode's reward."""
    if isinstance(infos, dict):
        infos = [_env_info(infos, i) for i in range(len(infos["trace"]))]
    records = [dict(info) for info in infos]
    for record, reward in zip(records, rewards if rewards is not None else []):
        record["reward"] = float(reward)
    return [Episode(n, None, record) for n, record in enumerate(records)]


def _env_info(infos: dict[str, Any], i: int) -> dict[str, Any]:
    """Env `i`'s info from a vector env's (nested dicts of per-env arrays; `_key` masks out)."""
    return {k: _env_info(v, i) if isinstance(v, dict) else v[i]
            for k, v in infos.items() if not k.startswith("_")}


def select(episodes: Sequence[Episode], number: int | None) -> list[Episode]:
    if number is None:
        return list(episodes)
    chosen = [e for e in episodes if e.number == number]
    if not chosen:
        raise TraceFileError(
            f"no episode {number}: the files hold {len(episodes)} episodes (0-{len(episodes) - 1})"
        )
    return chosen


# --- tokenizers -----------------------------------------------------------------------------


def load_tokenizer(spec: str = "tiny") -> Any:
    """`tiny`, `smollm2`, `hf:PATH`, or a local tokenizer/model directory."""
    if spec == "tiny":
        from ..engines.tiny import load_tiny_tokenizer

        return load_tiny_tokenizer()
    from transformers import AutoTokenizer

    if spec == "smollm2":
        from ..engines.smollm2 import smollm2_model_dir

        spec = str(smollm2_model_dir())
    path = Path(spec.removeprefix("hf:")).expanduser()
    if not path.is_dir():
        raise TraceFileError(f"no tokenizer directory at {path} (or use 'tiny', 'smollm2')")
    return AutoTokenizer.from_pretrained(path, local_files_only=True)


@dataclass
class Tokenizers:
    """Each episode's own tokenizer, loaded once per spec.

    `override` (`--tokenizer`) wins; else the spec the episode records; an episode that records
    none (written before harness-gym recorded it), or whose tokenizer cannot be loaded here, is
    decoded with `tiny` and the reason goes to `warn` and into `notes`.
    """

    override: str | None = None
    warn: Callable[[str], None] = lambda message: None
    notes: dict[int, str] = field(default_factory=dict)  # episode number -> fallback reason
    _loaded: dict[str, Any] = field(default_factory=dict)

    def spec_for(self, episode: Episode) -> str | None:
        if self.override:
            return self.override
        recorded = episode.data.get("tokenizer")
        return str(recorded) if recorded else None

    def for_episode(self, episode: Episode) -> Any:
        spec = self.spec_for(episode)
        if spec is None:
            return self._fallback(episode, "records no tokenizer (written by an older harness-gym)")
        try:
            return self._load(spec)
        except (OSError, ValueError, ImportError) as exc:
            if self.override:
                raise
            return self._fallback(episode, f"has tokenizer {spec!r}, which cannot be loaded "
                                           f"here ({exc})")

    def _fallback(self, episode: Episode, reason: str) -> Any:
        note = (f"episode {episode.number} {reason}: decoded with {FALLBACK_TOKENIZER!r}, "
                "which is gibberish for another model's ids; pass --tokenizer SPEC")
        if episode.number not in self.notes:
            self.notes[episode.number] = note
            self.warn(note)
        return self._load(FALLBACK_TOKENIZER)

    def _load(self, spec: str) -> Any:
        if spec not in self._loaded:
            self._loaded[spec] = load_tokenizer(spec)
        return self._loaded[spec]


def decode(tokenizer: Any, ids: Sequence[int]) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=False,
                            clean_up_tokenization_spaces=False)


def token_pieces(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """The text each token adds, decoded as the proxy streams it: the pieces join to the span's
    text, and a character split across byte-level tokens appears whole on the token that
    completes it (the tokens before it show nothing)."""
    detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens=False)
    pieces = [detokenizer.push([token]) for token in ids]
    if pieces:
        pieces[-1] += detokenizer.flush()
    return pieces


# --- segments -------------------------------------------------------------------------------


def response_spans(segment: dict[str, Any]) -> Iterator[Span]:
    ids, mask = segment["response_ids"], segment["loss_mask"]
    logprobs = segment["response_logprobs"]
    start = 0
    for end in range(1, len(ids) + 1):
        if end == len(ids) or bool(mask[end]) != bool(mask[start]):
            yield Span(bool(mask[start]), list(ids[start:end]), list(logprobs[start:end]))
            start = end


def policy_versions(segment: dict[str, Any]) -> str:
    versions = segment.get("policy_versions") or [segment.get("policy_version", 0)]
    return str(versions[0]) if len(set(versions)) == 1 else f"{min(versions)}..{max(versions)}"


def segment_summary(index: int, segment: dict[str, Any]) -> str:
    sampled = sum(1 for m in segment["loss_mask"] if m)
    versions = segment.get("policy_versions") or [segment.get("policy_version", 0)]
    flags = " incomplete" if segment.get("incomplete") else ""
    forced = sum(n for n in segment.get("forced_tokens") or [] if n)
    forced_text = f", forced {forced}" if forced else ""
    return (f"segment {index}: role={segment['role']} policy_version={policy_versions(segment)} "
            f"calls={segment.get('n_calls', len(versions))} prompt={len(segment['prompt_ids'])} "
            f"response={len(segment['response_ids'])} (sampled {sampled}, "
            f"inserted {len(segment['response_ids']) - sampled}{forced_text})"
            f"{_sampling_summary(segment)}{flags}{_relation(segment)}")


def _relation(segment: dict[str, Any]) -> str:
    parent = segment.get("parent")
    if parent is None:
        return ""
    call = segment.get("parent_call_id")
    if call:
        return f" <- sub-agent of segment {parent} (tool call {call})"
    return f" <- branch of segment {parent}"


def segment_tree(segments: Sequence[dict[str, Any]]) -> list[tuple[int, int]]:
    """(index, depth) of every segment in tree order: each segment under its `parent` (the
    segment it branched from, or whose tool call started it as a sub-agent), children in
    order. A parent link that does not point at an earlier segment makes a root.

    >>> segment_tree([{"parent": None}, {"parent": None}, {"parent": 0}, {"parent": 2}])
    [(0, 0), (2, 1), (3, 2), (1, 0)]
    """
    children: dict[int | None, list[int]] = {}
    for index, segment in enumerate(segments):
        parent = segment.get("parent")
        if not isinstance(parent, int) or not 0 <= parent < index:
            parent = None
        children.setdefault(parent, []).append(index)
    order: list[tuple[int, int]] = []
    stack = [(index, 0) for index in reversed(children.get(None, []))]
    while stack:
        index, depth = stack.pop()
        order.append((index, depth))
        stack.extend((child, depth + 1) for child in reversed(children.get(index, [])))
    return order


_SAMPLING = ("temperature", "top_p", "top_k", "max_tokens", "seed")


def _sampling_summary(segment: dict[str, Any]) -> str:
    """The calls' sampling settings: one line of them when every call shared them."""
    per_call = list(zip(*(segment.get(f"sampling_{name}") or [] for name in _SAMPLING)))
    settings = {call for call in per_call if any(v is not None for v in call)}
    if not settings:
        return ""
    if len(settings) > 1:
        return f" sampling={len(settings)} settings"
    (values,) = settings
    return " " + " ".join(f"{n}={v}" for n, v in zip(_SAMPLING, values) if v is not None)


EPISODE_FIELDS = ("task_id", "harness", "model", "outcome", "reward", "n_llm_calls",
                  "n_tool_calls")


def episode_summary(episode: Episode) -> str:
    fields = [f"{k}={episode.data[k]}" for k in EPISODE_FIELDS if k in episode.data]
    return f"episode {episode.number}: " + " ".join(fields)


def logprob_bucket(logprob: float) -> tuple[str, str]:
    p = math.exp(logprob)
    return next((css, style) for floor, css, style in LOGPROB_BUCKETS if p >= floor)


# --- terminal -------------------------------------------------------------------------------


def print_terminal(episodes: Sequence[Episode], tokenizers: Tokenizers, *,
                   show_prompt: bool = False, console: Any = None) -> None:
    """Print with rich: inserted tokens dim, sampled tokens green/yellow/red by p_old."""
    from rich.console import Console
    from rich.text import Text

    console = console or Console(highlight=False)
    for episode in episodes:
        tokenizer = tokenizers.for_episode(episode)
        console.print(Text(episode_summary(episode), style="bold"))
        segments = episode.segments
        for s, depth in segment_tree(segments):
            segment = segments[s]
            indent = "  " * depth + ("└ " if depth else "")
            console.print(Text(indent + segment_summary(s, segment), style="bold cyan"))
            text = Text()
            if show_prompt:
                text.append(decode(tokenizer, segment["prompt_ids"]), style="dim italic")
            for span in response_spans(segment):
                if not span.sampled:
                    text.append(decode(tokenizer, span.token_ids), style="dim")
                    continue
                pieces = token_pieces(tokenizer, span.token_ids)
                for piece, logprob in zip(pieces, span.logprobs):
                    text.append(piece, style=logprob_bucket(logprob)[1])
            console.print(text)
            console.print()
