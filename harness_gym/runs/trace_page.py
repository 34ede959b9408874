"""The trace as one self-contained HTML page (`harness-gym trace --html OUT.html`).

An index of the episodes (task, harness, outcome, reward, calls, segments) links to each
episode; per segment the prompt is collapsed and the response flows as text: every sampled token
is a `span.t` coloured by p_old (`lp-high`/`lp-mid`/`lp-low`) whose id and logprob show on hover,
tool calls the model wrote are boxed, and what the proxy inserted (tool results, user turns:
loss_mask 0) is a grey block. No network, no external assets: the file can be mailed around.
From Python::

    from harness_gym.runs.trace_view import Tokenizers, load_runs
    page = render_html(load_runs(["runs/episodes-x.jsonl"]), Tokenizers())
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from typing import Any

from .trace_view import (
    Episode,
    Tokenizers,
    decode,
    logprob_bucket,
    response_spans,
    segment_summary,
    segment_tree,
    token_pieces,
)

# Tool-call blocks in a sampled answer (the Hermes/Qwen format our chat templates ask for);
# an unclosed block runs to the end of the answer.
TOOL_CALL = re.compile(r"<tool_call>.*?(?:</tool_call>|\Z)", re.DOTALL)
OUTCOME_CLASS = {"passed": "ok", "failed": "bad", "harness_error": "bad", "timeout": "warn",
                 "infra_error": "warn"}


def render_html(episodes: Sequence[Episode], tokenizers: Tokenizers, *,
                title: str = "harness-gym trace") -> str:
    sections = [_episode_html(episode, tokenizers) for episode in episodes]
    return _PAGE.format(
        title=html.escape(title),
        index=_index_html(episodes),
        episodes="\n".join(sections),
        script=_SCRIPT,
    )


def render_inline(episodes: Sequence[Episode], tokenizers: Tokenizers, *,
                  title: str = "harness-gym trace", height_px: int = 520) -> str:
    """The page in an `<iframe srcdoc>`, for a notebook cell (`IPython.display.HTML`): its
    styles and hover script stay inside the frame instead of restyling the notebook."""
    page = render_html(episodes, tokenizers, title=title)
    return (f'<div class="harness-gym-trace"><iframe srcdoc="{html.escape(page, quote=True)}" '
            f'sandbox="allow-scripts" style="width: 100%; height: {height_px}px; '
            'border: 1px solid #ddd"></iframe></div>')


def _index_html(episodes: Sequence[Episode]) -> str:
    rows = []
    for episode in episodes:
        d = episode.data
        outcome = str(d.get("outcome", "?"))
        sampled = sum(sum(1 for m in s["loss_mask"] if m) for s in episode.segments)
        reward = d.get("reward")
        rows.append(
            f'<tr><td><a href="#episode-{episode.number}">{episode.number}</a></td>'
            f'<td><a href="#episode-{episode.number}">{_e(d.get("task_id", "?"))}</a></td>'
            f'<td>{_e(d.get("harness", "?"))}</td>'
            f'<td><span class="badge {OUTCOME_CLASS.get(outcome, "")}">{_e(outcome)}</span></td>'
            f'<td class="num">{"" if reward is None else f"{float(reward):.3f}"}</td>'
            f'<td class="num">{_e(d.get("n_llm_calls", ""))}</td>'
            f'<td class="num">{_e(d.get("n_tool_calls", ""))}</td>'
            f'<td class="num">{len(episode.segments)}</td>'
            f'<td class="num">{sampled}</td>'
            f'<td class="src">{_e(_source(episode))}</td></tr>'
        )
    return (
        '<table class="index"><thead><tr><th>#</th><th>task</th><th>harness</th>'
        '<th>outcome</th><th>reward</th><th>LLM calls</th><th>tool calls</th><th>segments</th>'
        '<th>sampled tokens</th><th>file</th></tr></thead><tbody>'
        + "".join(rows) + "</tbody></table>"
    )


def _episode_html(episode: Episode, tokenizers: Tokenizers) -> str:
    tokenizer = tokenizers.for_episode(episode)
    d = episode.data
    outcome = str(d.get("outcome", "?"))
    facts = [("model", d.get("model")), ("tokenizer", tokenizers.spec_for(episode)),
             ("reward", d.get("reward")), ("LLM calls", d.get("n_llm_calls")),
             ("tool calls", d.get("n_tool_calls")), ("duration", _seconds(d.get("duration_s"))),
             ("file", _source(episode) or None)]
    parts = [
        f'<section class="episode" id="episode-{episode.number}">',
        f'<h2>episode {episode.number} <span class="task">{_e(d.get("task_id", "?"))}</span> '
        f'<span class="harness">{_e(d.get("harness", ""))}</span> '
        f'<span class="badge {OUTCOME_CLASS.get(outcome, "")}">{_e(outcome)}</span> '
        '<a class="up" href="#index">index</a></h2>',
        '<p class="facts">' + " ".join(
            f"<span><b>{name}</b> {_e(value)}</span>" for name, value in facts if value is not None
        ) + "</p>",
    ]
    note = tokenizers.notes.get(episode.number)
    if note:
        parts.append(f'<p class="note">{_e(note)}</p>')
    parts.extend(_episode_details(d))
    for index, depth in segment_tree(episode.segments):  # sub-agents under their parent
        parts.append(_segment_html(index, episode.segments[index], tokenizer, depth))
    parts.append("</section>")
    return "\n".join(parts)


def _episode_details(d: dict[str, Any]) -> list[str]:
    """The episode's result beside its tokens: the agent's final words, tests, and patch."""
    out = []
    harness_output = d.get("harness_output") or {}
    final = harness_output.get("error") or harness_output.get("final_message")
    if final:
        out.append(f'<details><summary>harness output</summary><pre>{_e(final)}</pre></details>')
    tests = d.get("tests") or {}
    if tests:
        counts: dict[str, int] = {}
        for status in tests.values():
            counts[status] = counts.get(status, 0) + 1
        summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
        lines = "\n".join(f"{status:8} {name}" for name, status in tests.items())
        out.append(f"<details><summary>tests: {_e(summary)}</summary><pre>{_e(lines)}</pre>"
                   "</details>")
    patch = d.get("patch")
    if patch:
        out.append(f"<details><summary>patch ({patch.count(chr(10))} lines)</summary>"
                   f'<pre class="patch">{_e(patch)}</pre></details>')
    if d.get("error"):
        out.append(f'<p class="note">error: {_e(d["error"])}</p>')
    return out


def _segment_html(index: int, segment: dict[str, Any], tokenizer: Any, depth: int = 0) -> str:
    prompt = decode(tokenizer, segment["prompt_ids"])
    indent = f' style="margin-left: {2 * depth}em"' if depth else ""
    parts = [
        f'<section class="segment role-{_e(segment["role"])}"{indent}>',
        f"<h3>{_e(segment_summary(index, segment))}</h3>",
        f'<details class="prompt"><summary>prompt ({len(segment["prompt_ids"])} tokens)</summary>'
        f"<pre>{_e(prompt)}</pre></details>",
        '<div class="response">',
    ]
    special = set(getattr(tokenizer, "all_special_ids", None) or ())
    for span in response_spans(segment):
        if span.sampled:
            parts.append(_sampled_html(span, token_pieces(tokenizer, span.token_ids), special))
        else:
            text = decode(tokenizer, span.token_ids)
            parts.append(f'<div class="inserted" data-n="{len(span.token_ids)}">{_e(text)}</div>')
    parts.append("</div></section>")
    return "".join(parts)


def _sampled_html(span: Any, pieces: list[str], special: set[int]) -> str:
    text = "".join(pieces)
    calls = [(m.start(), m.end()) for m in TOOL_CALL.finditer(text)]
    out, offset, inside = [], 0, False
    for piece, token, logprob in zip(pieces, span.token_ids, span.logprobs):
        in_call = any(start <= offset < end for start, end in calls)
        if in_call != inside:
            out.append('<span class="call">' if in_call else "</span>")
            inside = in_call
        css = logprob_bucket(logprob)[0] + (" special" if token in special else "")
        out.append(f'<span class="t {css}" data-i="{token}" data-l="{logprob:.4f}">'
                   f"{_e(piece)}</span>")
        offset += len(piece)
    if inside:
        out.append("</span>")
    return "".join(out)


def _source(episode: Episode) -> str:
    return episode.source.name if episode.source is not None else ""


def _seconds(value: Any) -> str | None:
    return None if value is None else f"{float(value):.1f} s"


def _e(value: Any) -> str:
    return html.escape(str(value))


_SCRIPT = """
const tip = document.getElementById('tip');
document.addEventListener('mouseover', (event) => {
  const token = event.target.closest('.t, .inserted');
  if (!token) { tip.hidden = true; return; }
  if (token.classList.contains('inserted')) {
    tip.textContent = `inserted by the proxy: ${token.dataset.n} tokens, loss_mask 0`;
  } else {
    const logprob = Number(token.dataset.l);
    tip.textContent = `id ${token.dataset.i} · logprob ${logprob.toFixed(4)} · ` +
      `p ${Math.exp(logprob).toFixed(3)}`;
  }
  const box = token.getBoundingClientRect();
  tip.style.left = `${Math.min(box.left, window.innerWidth - 320)}px`;
  tip.style.top = `${box.bottom + 4}px`;
  tip.hidden = false;
});
"""

_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
body {{ font: 15px/1.5 system-ui, sans-serif; margin: 0 auto; padding: 1.5em 2em;
  max-width: 72em; color: #222; }}
h1 {{ font-size: 1.4em; margin: 0 0 .3em; }}
h2 {{ font-size: 1.15em; margin: 0 0 .3em; }}
h3 {{ font-size: .85em; font-weight: 600; color: #555; margin: 1em 0 .3em; }}
pre, .response {{ font: 13px/1.55 ui-monospace, SFMono-Regular, Menlo, monospace;
  white-space: pre-wrap; overflow-wrap: anywhere; margin: 0; }}
table.index {{ border-collapse: collapse; margin: 1em 0 2em; font-size: .9em; }}
table.index th, table.index td {{ padding: .25em .7em; border-bottom: 1px solid #e4e4e4;
  text-align: left; }}
table.index td.num {{ text-align: right; font-variant-numeric: tabular-nums; }}
table.index td.src {{ color: #888; }}
.badge {{ padding: .05em .5em; border-radius: .8em; background: #eee; font-size: .85em; }}
.badge.ok {{ background: #cdeccd; }} .badge.bad {{ background: #f6d0d0; }}
.badge.warn {{ background: #f6e7b4; }}
.episode {{ border-top: 2px solid #ddd; padding-top: 1em; margin-top: 1.5em; }}
.episode .task {{ font-family: ui-monospace, monospace; }}
.episode .harness {{ color: #666; font-weight: normal; }}
.up {{ font-size: .7em; font-weight: normal; margin-left: .5em; }}
.facts span {{ margin-right: 1.2em; white-space: nowrap; }} .facts b {{ color: #777;
  font-weight: 500; }}
.note {{ background: #fff4d6; border-left: 3px solid #e0b000; padding: .3em .6em; }}
details {{ margin: .3em 0; }} summary {{ cursor: pointer; color: #555; }}
details > pre {{ background: #f7f7f7; padding: .5em; max-height: 30em; overflow: auto; }}
.prompt > pre {{ color: #666; }}
.response {{ border-left: 3px solid #cfe3f6; padding-left: .8em; }}
.t {{ border-radius: 2px; }}
.t.lp-high {{ background: #d9f2d9; }} .t.lp-mid {{ background: #f7eab0; }}
.t.lp-low {{ background: #f7c6c6; }}
.t.special {{ font-size: .8em; color: #777; }}
.t:hover {{ outline: 1px solid #333; }}
.call {{ outline: 1px dashed #4a7bd0; outline-offset: 1px; }}
.inserted {{ color: #777; background: #f1f1f1; margin: .4em 0; padding: .3em .6em;
  max-height: 18em; overflow: auto; border-radius: 3px; }}
.inserted::before {{ content: "inserted \\00b7  " attr(data-n) " tokens (loss_mask 0)";
  display: block; font: italic 11px system-ui, sans-serif; color: #999; }}
.legend span {{ padding: 0 .4em; margin-right: .6em; }}
#tip {{ position: fixed; z-index: 10; background: #222; color: #fff; padding: .2em .5em;
  border-radius: 3px; font: 12px ui-monospace, monospace; pointer-events: none; }}
</style></head><body>
<h1 id="index">{title}</h1>
<p class="legend"><span class="t lp-high">sampled, p &ge; 0.5</span>
<span class="t lp-mid">0.1 &le; p &lt; 0.5</span><span class="t lp-low">p &lt; 0.1</span>
<span class="inserted-key" style="background:#f1f1f1;color:#777">inserted (loss_mask 0)</span>
<span class="call">tool call</span> hover a token for its id and logprob</p>
{index}
{episodes}
<div id="tip" hidden></div>
<script>{script}</script>
</body></html>
"""
