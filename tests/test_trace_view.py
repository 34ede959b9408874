"""`harness-gym trace`: a real trace (proxy + tiny-scored scripted policy + the openai SDK, with a
tool call and its result) written as a runs JSONL line, shown as HTML and in the terminal."""

from __future__ import annotations

import html
import json
import re

import openai
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.engines import tool_call_script

from harness_gym.cli import main
from harness_gym.engines import load_engine
from harness_gym.engines.scripted import ScriptedEngine
from harness_gym.proxy import InterceptionProxy
from harness_gym.trace_view import load_episodes

TOOL_OUTPUT = "TOOL-OUTPUT-42 written"
BASH = {"type": "function", "function": {
    "name": "bash", "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory):
    """One episode: the model calls bash, the harness answers, the model says it is done."""
    tiny = load_engine("tiny")
    try:
        with InterceptionProxy(ScriptedEngine(tiny, tool_call_script(turns=2))) as proxy:
            session = proxy.open_session()
            client = openai.OpenAI(base_url=proxy.base_url, api_key=session.session_id,
                                   max_retries=0)
            messages = [{"role": "user", "content": "make out0.txt"}]
            first = client.chat.completions.create(model="policy", messages=messages,
                                                   tools=[BASH]).choices[0].message
            call = first.tool_calls[0]
            messages += [
                {"role": "assistant", "content": first.content, "tool_calls": [
                    {"id": call.id, "type": "function", "function": {
                        "name": call.function.name, "arguments": call.function.arguments}}]},
                {"role": "tool", "tool_call_id": call.id, "content": TOOL_OUTPUT},
            ]
            client.chat.completions.create(model="policy", messages=messages, tools=[BASH])
            segments = session.trace_json()["segments"]
    finally:
        tiny.close()
    path = tmp_path_factory.mktemp("runs") / "episodes.jsonl"
    record = {"episode": 0, "task_id": "demo-task", "harness": "pi", "outcome": "passed",
              "reward": 1.0, "n_llm_calls": 2, "n_tool_calls": 1, "trace": segments}
    path.write_text(json.dumps(record) + "\n")
    return path


def spans_of(page: str, css: str) -> str:
    pattern = rf'<span class="{css}[^"]*"[^>]*>(.*?)</span>'
    return html.unescape("".join(re.findall(pattern, page, re.DOTALL)))


def test_the_html_shows_sampled_text_coloured_and_inserted_text_dimmed(trace_file, tmp_path):
    out = tmp_path / "trace.html"
    assert main(["trace", str(trace_file), "--episode", "0", "--html", str(out)]) == 0
    page = out.read_text()
    [segment] = load_episodes(trace_file)[0]["trace"]
    assert "role=agent" in page and "policy_version=0" in page
    assert f"prompt={len(segment['prompt_ids'])}" in page
    sampled, inserted = spans_of(page, "sampled"), spans_of(page, "inserted")
    assert "echo step0 > out0.txt" in sampled and "All done." in sampled
    assert TOOL_OUTPUT in inserted and TOOL_OUTPUT not in sampled
    assert re.search(r'class="sampled lp-(high|mid|low)" title="id \d+ logprob -?\d', page)
    n_sampled = sum(segment["loss_mask"])
    # one span per sampled token (the legend's spans carry no token id)
    assert len(re.findall(r'class="sampled [^"]*" title="id ', page)) == n_sampled


def test_the_terminal_view_prints_counts_and_decoded_text(trace_file, capsys):
    assert main(["trace", str(trace_file)]) == 0
    out = capsys.readouterr().out
    assert "episode 0: task_id=demo-task" in out and "outcome=passed" in out
    assert "role=agent" in out and "All done." in out and TOOL_OUTPUT in out


def test_a_recordtraces_parquet_file_reads_the_same(trace_file, tmp_path):
    [episode] = load_episodes(trace_file)
    path = tmp_path / "run.parquet"
    pq.write_table(pa.Table.from_pylist([episode]), path)
    assert load_episodes(path)[0]["trace"][0]["response_ids"] == episode["trace"][0]["response_ids"]
    assert main(["trace", str(path), "--html", str(tmp_path / "p.html")]) == 0


def test_an_unknown_episode_is_a_clear_error(trace_file):
    with pytest.raises(ValueError, match="no episode 5"):
        main(["trace", str(trace_file), "--episode", "5"])
