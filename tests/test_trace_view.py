"""`harness-gym trace`: a real trace (proxy + tiny-scored scripted policy + the openai SDK, with a
tool call and its result) written as a runs JSONL line, shown as HTML and in the terminal;
several files, the newest run by default, and each episode decoded with its own tokenizer."""

from __future__ import annotations

import html
import os
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.traces import TOOL_OUTPUT, episode_record, tool_call_segments, write_run

from harness_gym.cli import main
from harness_gym.runs.trace_view import Tokenizers, load_episodes, load_runs, token_pieces

PROSE = ("The proxy keeps the exact token ids of every turn, so the trainer sees what the model "
         "sampled. Überprüfung: naïve café, 日本語のテキスト, and an emoji 🚀 survive decoding. ")


@pytest.fixture(scope="module")
def segments():
    return tool_call_segments()


@pytest.fixture
def trace_file(segments, tmp_path):
    return write_run(tmp_path / "episodes-20260101-000000.jsonl", [episode_record(segments)])


@pytest.fixture(scope="module")
def own_tokenizer(tmp_path_factory):
    """A tokenizer unlike tiny's (a BPE trained here on a few sentences), saved as a directory
    the way a model's tokenizer is: ids from it mean other words under tiny."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator([PROSE] * 20, trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    directory = tmp_path_factory.mktemp("own-tokenizer")
    PreTrainedTokenizerFast(tokenizer_object=bpe).save_pretrained(directory)
    return directory


def _prose_record(tokenizer_dir: Path, **fields):
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(tokenizer_dir).encode(PROSE)
    segment = {"role": "agent", "prompt_ids": ids[:3], "response_ids": ids,
               "loss_mask": [1] * len(ids), "response_logprobs": [-0.1] * len(ids),
               "policy_version": 0, "policy_versions": [0], "n_calls": 1}
    return episode_record([segment], tokenizer=str(tokenizer_dir), **fields)


def spans_of(page: str, css: str) -> str:
    pattern = rf'<(?:span|div) class="{css}[^"]*"[^>]*>(.*?)</(?:span|div)>'
    return html.unescape("".join(re.findall(pattern, page, re.DOTALL)))


def test_the_html_shows_sampled_text_coloured_and_inserted_text_dimmed(trace_file, tmp_path):
    out = tmp_path / "trace.html"
    assert main(["trace", str(trace_file), "--episode", "0", "--html", str(out)]) == 0
    page = out.read_text()
    [segment] = load_episodes(trace_file)[0]["trace"]
    assert "role=agent" in page and "policy_version=0" in page
    assert f"prompt={len(segment['prompt_ids'])}" in page
    sampled, inserted = spans_of(page, "t "), spans_of(page, "inserted")
    assert "echo step0 > out0.txt" in sampled and "All done." in sampled
    assert TOOL_OUTPUT in inserted and TOOL_OUTPUT not in sampled
    # one span per sampled token, each with its exact id and logprob
    tokens = re.findall(r'class="t lp-(?:high|mid|low)[^"]*" data-i="(\d+)" data-l="(-?[\d.]+)"',
                        page)
    sampled_ids = [t for t, m in zip(segment["response_ids"], segment["loss_mask"]) if m]
    sampled_lps = [lp for lp, m in zip(segment["response_logprobs"], segment["loss_mask"]) if m]
    assert [int(i) for i, _ in tokens] == sampled_ids
    assert [float(lp) for _, lp in tokens] == pytest.approx(sampled_lps, abs=1e-4)
    # the model's tool call is boxed
    [call] = re.findall(r'<span class="call">((?:<span class="t[^>]*>[^<]*</span>)*)</span>', page)
    call_text = html.unescape(re.sub(r"<[^>]+>", "", call))
    assert call_text.startswith("<tool_call>") and call_text.endswith("</tool_call>")
    assert "echo step0" in call_text


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


def test_several_files_are_one_index_numbered_across_them(segments, tmp_path, capsys):
    first = write_run(tmp_path / "episodes-a.jsonl",
                      [episode_record(segments, task_id=f"task-a{i}") for i in range(2)])
    second = write_run(tmp_path / "episodes-b.jsonl", [episode_record(segments, task_id="task-b")])
    out = tmp_path / "trace.html"
    assert main(["trace", str(first), str(second), "--html", str(out)]) == 0
    page = out.read_text()
    rows = re.findall(r'<tr><td><a href="#episode-(\d+)">', page)
    assert rows == ["0", "1", "2"]
    assert all(f'id="episode-{n}"' in page for n in rows)
    assert re.search(r'href="#episode-2">task-b<', page)
    assert main(["trace", str(first), str(second), "--episode", "2"]) == 0
    assert "task_id=task-b" in capsys.readouterr().out


def test_with_no_file_the_newest_run_is_shown(segments, tmp_path, capsys):
    runs = tmp_path / "runs"
    runs.mkdir()
    old = write_run(runs / "episodes-20260101-000000.jsonl",
                    [episode_record(segments, task_id="old")])
    new = write_run(runs / "episodes-20260102-000000.jsonl",
                    [episode_record(segments, task_id="new")])
    os.utime(old, (1_000_000, 1_000_000))
    assert main(["trace", "--runs", str(runs)]) == 0
    captured = capsys.readouterr()
    assert "task_id=new" in captured.out and "task_id=old" not in captured.out
    assert new.name in captured.err


def test_each_episode_is_decoded_with_its_own_tokenizer(own_tokenizer, segments, tmp_path):
    run = write_run(tmp_path / "episodes.jsonl", [
        _prose_record(own_tokenizer, task_id="own"), episode_record(segments, task_id="tiny")])
    out = tmp_path / "trace.html"
    assert main(["trace", str(run), "--html", str(out)]) == 0
    text = html.unescape(re.sub(r"<[^>]+>", "", out.read_text()))
    assert PROSE.strip() in text  # unicode included: pieces split mid-character still join
    assert "All done." in text and TOOL_OUTPUT in text


def test_an_episode_without_a_recorded_tokenizer_falls_back_to_tiny_and_says_so(
        own_tokenizer, tmp_path, capsys):
    record = _prose_record(own_tokenizer)
    del record["tokenizer"]
    run = write_run(tmp_path / "episodes.jsonl", [record])
    out = tmp_path / "trace.html"
    assert main(["trace", str(run), "--html", str(out)]) == 0
    assert "records no tokenizer" in capsys.readouterr().err
    assert "records no tokenizer" in out.read_text()
    # --tokenizer names the right one
    assert main(["trace", str(run), "--tokenizer", str(own_tokenizer), "--html", str(out)]) == 0
    assert PROSE.strip() in html.unescape(re.sub(r"<[^>]+>", "", out.read_text()))


def test_token_pieces_join_to_the_decoded_text(own_tokenizer):
    tokenizers = Tokenizers(override=str(own_tokenizer))
    [episode] = load_runs([write_run(own_tokenizer.parent / "one.jsonl",
                                     [_prose_record(own_tokenizer)])])
    tokenizer = tokenizers.for_episode(episode)
    ids = episode.segments[0]["response_ids"]
    pieces = token_pieces(tokenizer, ids)
    assert len(pieces) == len(ids) and "".join(pieces) == tokenizer.decode(ids)
    assert "\ufffd" not in "".join(pieces)


def test_text_from_the_trace_cannot_inject_markup(segments, tmp_path):
    """A task id, a patch or a tool result is agent-controlled: it is escaped, never markup."""
    evil = '<script>alert(1)</script><img src=x onerror=alert(2)>'
    record = episode_record(segments, task_id=evil, patch=evil,
                            harness_output={"final_message": evil})
    out = tmp_path / "trace.html"
    assert main(["trace", str(write_run(tmp_path / "e.jsonl", [record])), "--html", str(out)]) == 0
    page = out.read_text()
    assert "<img" not in page and page.count("<script>") == 1  # only the page's own


@pytest.mark.parametrize("argv, message", [
    (["trace", "missing.jsonl"], "no trace file at missing.jsonl"),
    (["trace", "--runs", "nowhere"], "no trace files in nowhere/"),
])
def test_a_missing_file_is_one_line(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_an_unknown_episode_is_a_clear_error(trace_file, capsys):
    assert main(["trace", str(trace_file), "--episode", "5"]) == 2
    assert "no episode 5: the files hold 1 episodes" in capsys.readouterr().err
