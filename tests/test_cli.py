"""The `harness-gym` command as a new user meets it: a run shows its model calls as they happen
and ends with the command that shows the result; a mistake is one line, not a traceback; every
command a message names exists."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import openai
import pytest

from harness_gym.cli import build_parser, episode_settings, main
from harness_gym.config import EpisodeConfig
from harness_gym.proxy import CallProgress, InterceptionProxy, ProxySettings
from harness_gym.runs.recording import CallMeter

REPO = Path(__file__).resolve().parent.parent
HARNESS_GYM = Path(sys.executable).with_name("harness-gym")
PROGRESS_LINE = re.compile(
    r"\d+ calls?, [\d,]+ tokens, (?:[\d.]+ tok/s|sampling|reading a [\d,]+-token prompt)")


def test_the_proxy_reports_each_call_as_it_samples(tmp_path):
    reports: list[CallProgress] = []
    lines: list[str] = []
    meter = CallMeter(lines.append, interval_s=0.0)

    def observe(progress: CallProgress) -> None:
        reports.append(progress)
        meter(progress)

    with InterceptionProxy("tiny", settings=ProxySettings(on_progress=observe)) as proxy:
        session = proxy.open_session(sampling={"max_tokens": 24, "temperature": 1.0})
        client = openai.OpenAI(base_url=proxy.base_url, api_key=session.session_id, max_retries=0)
        for _ in range(2):
            stream = client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hello"}], stream=True)
            for _ in stream:
                pass
        sampled = sum(sum(s["loss_mask"]) for s in session.trace_json()["segments"])
        proxy.engine.close()

    finished = [r for r in reports if r.finished]
    assert len(finished) == 2 and all(r.session_id == session.session_id for r in reports)
    # each call: a start with nothing sampled, growing counts, one final report
    first_call = reports[: reports.index(finished[0]) + 1]
    assert first_call[0].completion_tokens == 0 and not first_call[0].finished
    counts = [r.completion_tokens for r in first_call]
    assert counts == sorted(counts) and counts[-1] > 0
    assert sum(r.completion_tokens for r in finished) == sampled
    assert meter.calls == 2 and meter.tokens == sampled
    assert all(PROGRESS_LINE.fullmatch(line) for line in lines)
    assert lines[-1].startswith(f"2 calls, {sampled:,} tokens, ")


def test_the_meter_shows_start_and_end_and_throttles_between():
    lines: list[str] = []
    now = [100.0]
    meter = CallMeter(lines.append, interval_s=60, clock=lambda: now[0])
    meter(CallProgress("s", 900, 0, False))  # the call arrives: its prompt is being read
    now[0] += 30  # a long prefill
    for n in range(1, 51):  # then 20 tokens/s
        meter(CallProgress("s", 900, n, False))
        now[0] += 0.05
    meter(CallProgress("s", 900, 50, True))
    assert lines == ["1 call, 0 tokens, reading a 900-token prompt",
                     "1 call, 50 tokens, 19.6 tok/s"]  # 49 tokens after the first in 2.5 s
    meter(CallProgress("s", 900, 0, False))
    assert lines[-1] == "2 calls, 50 tokens, reading a 900-token prompt"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("npm") is None, reason="Pi installs with npm")
def test_a_run_shows_its_calls_live_and_ends_with_the_command_that_shows_them(tmp_path):
    run = subprocess.run(
        [str(HARNESS_GYM), "run", "--harness", "pi", "--engine", "oracle", "--episodes", "1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 0, run.stderr
    assert "loading engine 'oracle' and harness 'pi'" in run.stderr
    progress = [line for line in re.split(r"[\r\n]", run.stderr) if PROGRESS_LINE.search(line)]
    assert progress, run.stderr  # the calls were shown as they happened
    assert "Traceback" not in run.stderr
    assert "episode 0: " in run.stdout and " passed " in run.stdout
    last = run.stdout.strip().splitlines()[-1]
    match = re.fullmatch(r"next: (harness-gym trace (runs/episodes-\S+\.jsonl) --html trace\.html)"
                         r"\s+\(then open trace\.html in a browser\)", last)
    assert match, last
    assert (tmp_path / match.group(2)).is_file()

    argv = shlex.split(match.group(1))
    shown = subprocess.run([str(HARNESS_GYM), *argv[1:]], cwd=tmp_path, capture_output=True,
                           text=True, timeout=300)
    assert shown.returncode == 0, shown.stderr
    page = (tmp_path / "trace.html").read_text()
    assert "harness-gym__" in page and "passed" in page


@pytest.mark.parametrize("argv, message", [
    (["run", "--engine", "smollm"], "unknown engine 'smollm'"),
    (["run", "--harness", "pii", "--engine", "oracle"], "unknown harness 'pii'"),
    (["run", "--tasks", "no-such-tasks.jsonl", "--engine", "oracle"], "no-such-tasks.jsonl"),
    (["trace", "no-such-run.jsonl"], "no trace file at no-such-run.jsonl"),
])
def test_a_user_mistake_is_one_line_without_a_traceback(argv, message, tmp_path, monkeypatch,
                                                        capsys):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    *before, line = err.strip().splitlines()
    assert all(s.startswith("loading engine ") for s in before)  # at most the status line
    assert line.startswith("harness-gym: error: ")
    assert line.endswith("(--debug shows the traceback)")
    if "smollm" in argv:  # names are checked with hints
        assert "did you mean 'smollm2'?" in line
    if "pii" in argv:
        assert "did you mean 'pi'?" in line


def test_debug_shows_the_traceback(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="no trace file"):
        main(["trace", "no-such-run.jsonl", "--debug"])
    with pytest.raises(ValueError, match="no trace file"):
        main(["--debug", "trace", "no-such-run.jsonl"])


def test_the_installed_command_prints_one_line_for_a_mistake(tmp_path):
    run = subprocess.run([str(HARNESS_GYM), "trace", "missing.jsonl"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "COLUMNS": "200"})
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.strip().splitlines() == [
        "harness-gym: error: no trace file at missing.jsonl (--debug shows the traceback)"]


def test_every_harness_gym_command_a_message_names_exists():
    """Skip reasons, errors and docs name commands a user will type (in backticks or
    parentheses, and in the README's shell blocks): each must exist."""
    parser = build_parser()
    commands = set(next(a for a in parser._actions if a.dest == "command").choices)
    inline = re.compile(r"[`(]harness-gym ([a-z][a-z-]*)")
    shell = re.compile(r"(?:^|[\s/])harness-gym ([a-z][a-z-]*)", re.MULTILINE)
    readme = (REPO / "README.md").read_text()
    named = {(word, "README.md") for block in re.findall(r"```bash\n(.*?)```", readme, re.DOTALL)
             for word in shell.findall(block)}
    assert {"demo", "run", "trace"} <= {word for word, _ in named}
    for pattern in ("README.md", "harness_gym/**/*.py", "harnesses/*.py", "tasks/*.py",
                    "wrappers/*.py", "tests/*.py"):
        for path in REPO.glob(pattern):
            named |= {(word, path.name) for word in inline.findall(path.read_text())}
    assert {(word, where) for word, where in named if word not in commands} == set()


def _subcommand_paths(parser, prefix=()):
    """Every (sub)command's argv prefix: ("serve",), ("tasks", "generate"), ..."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _subcommand_paths(sub, (*prefix, name))
            return
    yield prefix


def test_every_subcommand_takes_debug_after_its_name():
    parser = build_parser()
    paths = list(_subcommand_paths(parser))
    assert {("serve",), ("run",), ("demo",), ("trace",), ("tasks", "validate")} <= set(paths)
    for path in paths:
        sub = parser
        for name in path:
            sub = next(a for a in sub._actions
                       if isinstance(a, argparse._SubParsersAction)).choices[name]
        assert "--debug" in sub._option_string_actions, path


def test_run_and_demo_defaults_are_episode_config_defaults():
    """No number is copied: a flag not given leaves the setting to EpisodeConfig."""
    defaults = EpisodeConfig()
    for argv in (["run"], ["demo"]):
        args = build_parser().parse_args(argv)
        if argv == ["demo"]:
            args.harness, args.sandbox, args.quiet = "pi", None, False  # what _demo sets
        config = EpisodeConfig.build(**episode_settings(args))
        for name in ("engine", "episode_timeout_s", "test_timeout_s", "max_model_calls",
                     "sandbox"):
            assert getattr(config, name) == getattr(defaults, name), (argv, name)
        assert [h.name for h in config.harness] == [h.name for h in defaults.harness]
    given = build_parser().parse_args(["run", "--episode-timeout", "42", "--engine", "oracle",
                                       "--max-model-calls", "12"])
    config = EpisodeConfig.build(**episode_settings(given))
    assert (config.episode_timeout_s, config.engine, config.max_model_calls) == \
        (42.0, "oracle", 12)


def test_serve_help_says_the_admin_routes_are_open_on_loopback_without_a_key():
    run = subprocess.run([str(HARNESS_GYM), "serve", "--help"], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "COLUMNS": "400"})
    said = " ".join(run.stdout.split())
    assert "OPEN to every local client when --host is a loopback address" in said
    assert "a random key is made up and printed at start" in said
