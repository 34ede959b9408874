"""Reading a recorded trace as text: `harness-gym trace FILE [--episode N] [--html OUT.html]`.

A trace is token ids; to check what a policy was trained on, a person needs the words, and needs
to see which of them the model sampled (loss_mask 1, coloured by their logprob: p_old) and which
the proxy inserted (tool results, user turns: loss_mask 0, dimmed). FILE is a run's JSON Lines
(`harness-gym run`, one episode a line) or a Parquet file from `wrappers.RecordTraces`.

Tokens are decoded one by one, so a character split across byte-level tokens shows as `�` in
the coloured view; the counts and ids are exact.

>>> episodes = load_episodes("runs/episodes-20260101-120000.jsonl")  # doctest: +SKIP
>>> html = render_html(episodes, load_tokenizer("tiny"))              # doctest: +SKIP
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .trace import normalize_segment

# p_old buckets for colouring sampled tokens: (lower bound on p, css class, terminal style).
LOGPROB_BUCKETS = (
    (0.5, "lp-high", "green"),
    (0.1, "lp-mid", "yellow"),
    (0.0, "lp-low", "red"),
)


@dataclass(frozen=True)
class Span:
    """A run of response tokens with the same loss mask."""

    sampled: bool
    token_ids: list[int]
    logprobs: list[float]


def load_episodes(path: str | Path) -> list[dict[str, Any]]:
    """Episodes (dicts with a `trace` list of segments) from a runs JSONL or a Parquet file;
    each segment has exactly `SEGMENT_SCHEMA`'s fields."""
    episodes = _read_episodes(Path(path))
    for episode in episodes:
        episode["trace"] = [normalize_segment(s) for s in episode.get("trace") or []]
    return episodes


def _read_episodes(path: Path) -> list[dict[str, Any]]:
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
                raise ValueError(f"{path}:{number} is not a JSON line: {exc}") from None
    return episodes


def load_tokenizer(spec: str = "tiny") -> Any:
    """`tiny`, `smollm2`, or a local tokenizer/model directory."""
    if spec == "tiny":
        from .engines.tiny import load_tiny_tokenizer

        return load_tiny_tokenizer()
    from transformers import AutoTokenizer

    if spec == "smollm2":
        from .engines.smollm2 import smollm2_model_dir

        spec = str(smollm2_model_dir())
    if not Path(spec).expanduser().is_dir():
        raise FileNotFoundError(f"no tokenizer directory at {spec} (or use 'tiny', 'smollm2')")
    return AutoTokenizer.from_pretrained(Path(spec).expanduser(), local_files_only=True)


def response_spans(segment: dict[str, Any]) -> Iterator[Span]:
    ids, mask = segment["response_ids"], segment["loss_mask"]
    logprobs = segment["response_logprobs"]
    start = 0
    for end in range(1, len(ids) + 1):
        if end == len(ids) or bool(mask[end]) != bool(mask[start]):
            yield Span(bool(mask[start]), list(ids[start:end]), list(logprobs[start:end]))
            start = end


def segment_summary(index: int, segment: dict[str, Any]) -> str:
    sampled = sum(1 for m in segment["loss_mask"] if m)
    versions = segment.get("policy_versions") or [segment.get("policy_version", 0)]
    shown = str(versions[0]) if len(set(versions)) == 1 else f"{min(versions)}..{max(versions)}"
    flags = " incomplete" if segment.get("incomplete") else ""
    return (f"segment {index}: role={segment['role']} policy_version={shown} "
            f"calls={segment.get('n_calls', len(versions))} prompt={len(segment['prompt_ids'])} "
            f"response={len(segment['response_ids'])} (sampled {sampled}, "
            f"inserted {len(segment['response_ids']) - sampled}){flags}")


def episode_summary(index: int, episode: dict[str, Any]) -> str:
    fields = [f"{k}={episode[k]}" for k in ("task_id", "harness", "outcome", "reward",
                                             "n_llm_calls", "n_tool_calls") if k in episode]
    return f"episode {episode.get('episode', index)}: " + " ".join(fields)


def logprob_bucket(logprob: float) -> tuple[str, str]:
    p = math.exp(logprob)
    return next((css, style) for floor, css, style in LOGPROB_BUCKETS if p >= floor)


def select(episodes: Sequence[dict[str, Any]], episode: int | None) -> list[tuple[int, dict]]:
    indexed = list(enumerate(episodes))
    if episode is None:
        return indexed
    chosen = [(i, e) for i, e in indexed if e.get("episode", i) == episode]
    if not chosen:
        raise ValueError(f"no episode {episode}: the file holds {len(episodes)} episodes")
    return chosen


def print_terminal(episodes: Sequence[tuple[int, dict]], tokenizer: Any, *,
                   show_prompt: bool = False, console: Any = None) -> None:
    """Print with rich: inserted tokens dim, sampled tokens green/yellow/red by p_old."""
    from rich.console import Console
    from rich.text import Text

    console = console or Console(highlight=False)
    for index, episode in episodes:
        console.print(Text(episode_summary(index, episode), style="bold"))
        for s, segment in enumerate(episode.get("trace") or []):
            console.print(Text(segment_summary(s, segment), style="bold cyan"))
            text = Text()
            if show_prompt:
                text.append(_decode(tokenizer, segment["prompt_ids"]), style="dim italic")
            for span in response_spans(segment):
                if not span.sampled:
                    text.append(_decode(tokenizer, span.token_ids), style="dim")
                    continue
                for token, logprob in zip(span.token_ids, span.logprobs):
                    text.append(_decode(tokenizer, [token]), style=logprob_bucket(logprob)[1])
            console.print(text)
            console.print()


def render_html(episodes: Sequence[tuple[int, dict]], tokenizer: Any, *,
                title: str = "harness-gym trace") -> str:
    """A self-contained HTML page: `span.inserted` (mask 0) dimmed, `span.sampled` tokens with
    an `lp-*` class by p_old and the exact logprob and id in their tooltip."""
    body = []
    for index, episode in episodes:
        body.append(f"<h2>{html.escape(episode_summary(index, episode))}</h2>")
        for s, segment in enumerate(episode.get("trace") or []):
            body.append(f'<section class="segment role-{html.escape(segment["role"])}">')
            body.append(f"<h3>{html.escape(segment_summary(s, segment))}</h3>")
            prompt = html.escape(_decode(tokenizer, segment["prompt_ids"]))
            body.append(f'<details><summary>prompt ({len(segment["prompt_ids"])} tokens)'
                        f'</summary><pre class="prompt">{prompt}</pre></details>')
            body.append('<pre class="response">')
            for span in response_spans(segment):
                if not span.sampled:
                    text = html.escape(_decode(tokenizer, span.token_ids))
                    body.append(f'<span class="inserted" title="inserted by the proxy, '
                                f'{len(span.token_ids)} tokens, loss_mask 0">{text}</span>')
                    continue
                for token, logprob in zip(span.token_ids, span.logprobs):
                    css = logprob_bucket(logprob)[0]
                    text = html.escape(_decode(tokenizer, [token]))
                    body.append(f'<span class="sampled {css}" '
                                f'title="id {token} logprob {logprob:.4f}">{text}</span>')
            body.append("</pre></section>")
    return _PAGE.format(title=html.escape(title), body="\n".join(body))


def _decode(tokenizer: Any, ids: Sequence[int]) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=False)


_PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; }}
pre {{ white-space: pre-wrap; font-family: ui-monospace, monospace; line-height: 1.5; }}
.prompt, .inserted {{ color: #888; }}
.inserted {{ background: #f3f3f3; }}
.sampled.lp-high {{ background: #c8f0c8; }}
.sampled.lp-mid {{ background: #f5e6a8; }}
.sampled.lp-low {{ background: #f5c0c0; }}
.segment {{ border-top: 1px solid #ccc; margin-top: 1em; }}
.legend span {{ padding: 0 .4em; margin-right: .5em; }}
</style></head><body>
<h1>{title}</h1>
<p class="legend"><span class="inserted">inserted (loss_mask 0)</span>
<span class="sampled lp-high">sampled, p &ge; 0.5</span>
<span class="sampled lp-mid">0.1 &le; p &lt; 0.5</span>
<span class="sampled lp-low">p &lt; 0.1</span></p>
{body}
</body></html>
"""
