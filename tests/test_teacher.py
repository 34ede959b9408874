"""The teacher engine: it reads the file a task is about, edits it with old/new text taken from
what it read, and stops; in the policy's own tokens and tool-call format; with a seeded share
of needless steps. Its edits are checked against every built-in gold patch, its tool detection
against each CLI's recorded tool list, and whole episodes through the real Pi CLI."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

import harness_gym  # noqa: F401  (registers HarnessSWE-v0)
from harness_gym.engines import SamplingParams, load_engine
from harness_gym.engines.agent_tools import AgentTools
from harness_gym.engines.teacher import Step, TeacherEngine, load_teacher_engine
from harness_gym.engines.text_edits import EditNotGrounded, parse_patch
from harness_gym.proxy.anthropic_messages import parse_messages_request
from harness_gym.proxy.openai_chat import parse_chat_request
from harness_gym.proxy.tool_parsers import HermesToolCallParser, TextDelta, ToolCallDone
from harness_gym.tasks import apply_patch, load_tasks

from support.parallel import in_threads
from support.task_sandboxes import task_sandbox

FIXTURES = Path(__file__).parent / "fixtures"
BUILTIN = load_tasks("builtin")
TRAIN = load_tasks("family:train")
SYMPTOM = load_tasks("family-symptom:train")
PI_TOOLS = [t.template_dict() for t in parse_chat_request(
    json.loads((FIXTURES / "pi_requests.json").read_text())[0]["body"]).tools]


@pytest.fixture(scope="module")
def tiny_teacher() -> Any:
    engine = load_teacher_engine("tiny")
    yield engine
    engine.close()


def changed_lines(diff: str) -> list[str]:
    return sorted(line for line in diff.splitlines()
                  if line[:1] in "+-" and not line.startswith(("+++", "---")))


# --- edits ----------------------------------------------------------------------------------


@pytest.mark.parametrize("task", BUILTIN + TRAIN[:10], ids=lambda t: t.instance_id)
def test_edits_grounded_in_the_original_files_rebuild_what_the_gold_patch_makes(task, tmp_path):
    with task_sandbox(task, tmp_path) as sandbox:
        apply_patch(sandbox, task.patch, allow_fuzz=False)
        for file in parse_patch(task.patch):
            fixed = sandbox.read_file(f"{sandbox.workdir}/{file.path}").decode()
            if file.new_file:
                assert file.new_content == fixed
                continue
            original = (task.repo_dir / file.path).read_text()
            edited = original
            for edit in file.edits(original):
                assert original.count(edit.old) == 1  # what an exact-text edit tool accepts
                edited = edited.replace(edit.old, edit.new, 1)
            assert edited == fixed, file.path


PATCH = """diff --git a/m.py b/m.py
--- a/m.py
+++ b/m.py
@@ -4,4 +4,4 @@ def b():
 
 def c():
     x = 1
-    return x
+    return x + 1
"""


def test_an_edit_widens_with_context_until_its_old_text_is_unique():
    text = "def a():\n    x = 1\n    return x\n\ndef c():\n    x = 1\n    return x\n"
    (edit,) = parse_patch(PATCH)[0].edits(text)
    assert text.count(edit.old) == 1
    assert edit.old.endswith("    return x") and "def c():" in edit.old
    assert text.replace(edit.old, edit.new).endswith("def c():\n    x = 1\n    return x + 1\n")


def test_an_edit_of_text_that_was_not_read_is_refused():
    with pytest.raises(EditNotGrounded, match="not in what was read"):
        parse_patch(PATCH)[0].edits("def c():\n    y = 2\n")


# --- tools ----------------------------------------------------------------------------------


def recorded_tools(cli: str) -> list[dict]:
    body = json.loads((FIXTURES / f"{cli}_requests.json").read_text())[0]["body"]
    parse = parse_messages_request if cli == "claude_code" else parse_chat_request
    return [tool.template_dict() for tool in parse(body).tools]


@pytest.mark.parametrize(("cli", "expected"), [
    ("pi", AgentTools(shell="bash", read=("read", "path"), edit=("edit", "path", "oldText",
                      "newText"), edit_list="edits", write=("write", "path", "content"))),
    ("claude_code", AgentTools(shell="Bash", read=("Read", "file_path"), edit=(
        "Edit", "file_path", "old_string", "new_string"), write=("Write", "file_path", "content"))),
    ("opencode", AgentTools(shell="bash", read=("read", "filePath"), edit=(
        "edit", "filePath", "oldString", "newString"), write=("write", "filePath", "content"))),
    ("hermes", AgentTools(shell="terminal", read=("read_file", "path"), edit=(
        "patch", "path", "old_string", "new_string"), write=("write_file", "path", "content"))),
])
def test_the_tools_for_each_move_are_found_in_each_clis_own_tool_list(cli, expected):
    assert AgentTools.from_specs(recorded_tools(cli)) == expected


def test_tools_are_read_from_the_rendered_prompt(tiny_teacher):
    prompt = tiny_teacher.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tools=PI_TOOLS, tokenize=False)
    assert AgentTools.from_prompt(prompt) == AgentTools.from_specs(PI_TOOLS)


def test_without_an_edit_tool_the_shell_edits_the_file(tmp_path):
    shell_only = AgentTools(shell="terminal")
    target = tmp_path / "m.py"
    target.write_text("RATE = 5\nname = 'it''s'\n")
    edits = parse_patch("diff --git a/m.py b/m.py\n--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n"
                        "-RATE = 5\n+RATE = 7\n")[0].edits(target.read_text())
    ((tool, arguments),) = shell_only.edit_calls("m.py", edits)
    assert tool == "terminal"
    subprocess.run(["bash", "-c", arguments["command"]], cwd=tmp_path, check=True)
    assert target.read_text() == "RATE = 7\nname = 'it''s'\n"


# --- the plan ---------------------------------------------------------------------------------


def test_a_plan_reads_the_file_then_edits_it_and_churn_is_a_seeded_fraction(tiny_teacher):
    tools = AgentTools.from_specs(PI_TOOLS)

    def plans(churn: float, seed: int) -> list[list[Step]]:
        teacher = TeacherEngine(tiny_teacher.tokenizer, max_context=4096,
                                stop_token_ids=tiny_teacher.stop_token_ids, churn=churn, seed=seed)
        return [teacher.plan(task, tools) for task in TRAIN]

    direct = plans(0.0, 0)
    for task, plan in zip(TRAIN, direct, strict=True):
        path = task.extra["family"]["path"]
        assert plan == [Step("read", path), Step("edit", path)]
    churned = plans(0.3, 0)
    extra = [plan for plan in churned if len(plan) > 2]
    assert 0.2 <= len(extra) / len(TRAIN) <= 0.4
    assert {s.kind for plan in extra for s in plan} == {"ls", "read", "edit", "test"}
    assert any(plan.count(plan[1]) == 2 for plan in extra if plan[0].kind == "read")  # re-reads
    assert plans(0.3, 0) == churned  # seeded
    assert plans(0.3, 1) != churned
    assert all(len(plan) > 2 for plan in plans(1.0, 0))


def test_churn_at_0_6_adds_needless_steps_of_every_kind_to_most_demonstrations(tiny_teacher):
    tools = AgentTools.from_specs(PI_TOOLS)
    teacher = TeacherEngine(tiny_teacher.tokenizer, max_context=4096,
                            stop_token_ids=tiny_teacher.stop_token_ids, churn=0.6)
    direct = TeacherEngine(tiny_teacher.tokenizer, max_context=4096,
                           stop_token_ids=tiny_teacher.stop_token_ids, churn=0.0)
    pairs = [(direct.plan(t, tools), teacher.plan(t, tools)) for t in TRAIN]
    churned = [(a, b) for a, b in pairs if len(b) > len(a)]
    assert 0.5 <= len(churned) / len(TRAIN) <= 0.7
    for plain, plan in churned:
        assert [s for s in plan if s.kind in ("edit", "write")] == [
            s for s in plain if s.kind in ("edit", "write")]  # the fix still lands
    first_test = [p for _, p in churned
                  if p[0] == Step("test") or p[:2] == [Step("ls"), Step("test")]]
    last_test = [p for _, p in churned if p[-1] == Step("test")]
    after = [p for _, p in churned if any(
        a.kind == "edit" and b == Step("read", a.path) for a, b in zip(p, p[1:]))]
    assert first_test and last_test and after


def test_a_symptom_task_is_demonstrated_from_ls_and_the_module_its_statement_calls(tiny_teacher):
    tools = AgentTools.from_specs(PI_TOOLS)
    teacher = TeacherEngine(tiny_teacher.tokenizer, max_context=4096,
                            stop_token_ids=tiny_teacher.stop_token_ids, churn=0.0)
    for task in SYMPTOM[:20]:
        family = task.extra["family"]
        assert teacher.plan(task, tools) == [Step("ls"), Step("read", family["entry"]),
                                             Step("read", family["path"]),
                                             Step("edit", family["path"])]


# --- tokens -----------------------------------------------------------------------------------


def conversation(tokenizer: Any, task: Any, *turns: dict) -> list[int]:
    messages = [{"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": task.problem_statement}, *turns]
    return tokenizer.apply_chat_template(messages, tools=PI_TOOLS, add_generation_prompt=True,
                                         return_dict=False)


def called(text: str, tool: str, arguments: dict) -> dict:
    """An assistant turn that called `tool`, as a CLI sends it back."""
    return {"role": "assistant", "content": text, "tool_calls": [
        {"type": "function", "function": {"name": tool, "arguments": arguments}}]}


def parsed(text: str) -> tuple[str, list[Any]]:
    parser = HermesToolCallParser()
    events = parser.feed(text) + parser.finish()
    words = "".join(e.text for e in events if isinstance(e, TextDelta))
    return words, [e.call for e in events if isinstance(e, ToolCallDone)]


def answer(engine: Any, prompt: list[int]) -> tuple[list[int], list[float], str]:
    completion = asyncio.run(engine.generate(prompt, SamplingParams(max_tokens=512)))
    assert completion.finish_reason == "stop"
    text = engine.tokenizer.decode(completion.token_ids[:-1])
    return completion.token_ids, completion.logprobs, text


def test_the_teacher_reads_then_edits_what_it_read_then_stops_in_the_policys_tokens(
    tiny_teacher,
):
    task = TRAIN[3]
    path, tokenizer = task.extra["family"]["path"], tiny_teacher.tokenizer
    teacher = TeacherEngine(tokenizer, max_context=tiny_teacher.max_context,
                            stop_token_ids=tiny_teacher.stop_token_ids,
                            scorer=tiny_teacher.scorer, churn=0.0)
    teacher.add_tasks([task])

    prompt = conversation(tokenizer, task)
    ids, logprobs, text = answer(teacher, prompt)
    words, (call,) = parsed(text)
    assert (call.name, call.arguments) == ("read", {"path": path})
    # The policy's tokens: the tokenizer's own encoding of the text, then <|im_end|>.
    assert ids == tokenizer.encode(text, add_special_tokens=False) + [
        tokenizer.convert_tokens_to_ids("<|im_end|>")]
    # Logprobs are the tiny policy's real scores: re-scoring reproduces them.
    assert logprobs == pytest.approx(tiny_teacher.scorer.score(prompt, ids), abs=1e-5)

    source = (task.repo_dir / path).read_text()
    read_turns = (called(words, "read", {"path": path}), {"role": "tool", "content": source})
    _, _, text = answer(teacher, conversation(tokenizer, task, *read_turns))
    _, (edit,) = parsed(text)
    assert edit.name == "edit" and edit.arguments["path"] == path
    (pair,) = edit.arguments["edits"]
    assert source.count(pair["oldText"]) == 1  # taken from what was read
    assert changed_lines(task.patch) == sorted(
        ["-" + pair["oldText"].strip("\n"), "+" + pair["newText"].strip("\n")])

    edit_turns = (called("I will fix it.", "edit", edit.arguments),
                  {"role": "tool", "content": "Successfully replaced 1 block(s)."})
    _, _, text = answer(teacher, conversation(tokenizer, task, *read_turns, *edit_turns))
    assert parsed(text) == (f"I fixed the bug in {path}.", [])


def test_the_teacher_does_not_guess_when_the_file_it_read_lacks_the_text(tiny_teacher):
    task = TRAIN[4]
    path = task.extra["family"]["path"]
    teacher = TeacherEngine(tiny_teacher.tokenizer, max_context=4096,
                            stop_token_ids=tiny_teacher.stop_token_ids, churn=0.0)
    teacher.add_tasks([task])
    turns = (called("Reading.", "read", {"path": path}),
             {"role": "tool", "content": "ENOENT: no such file or directory"})
    ids, logprobs, text = answer(teacher, conversation(teacher.tokenizer, task, *turns))
    assert parsed(text)[1] == [] and "could not make the change" in text
    assert set(logprobs) == {0.0}  # no scorer: documented zeros


def test_teacher_smollm2_speaks_smollm2s_tokens_and_template():
    pytest.importorskip("gguf")
    try:
        teacher = load_engine("teacher:smollm2")
    except ImportError as error:
        pytest.skip(f"SmolLM2's weights are not installed: {error}")
    policy_vocab = teacher.tokenizer.get_vocab()
    assert len(policy_vocab) == 49152 and teacher.max_context == 8192
    assert teacher.model_name == "teacher-smollm2" and teacher.scorer is None
    assert teacher.end_of_turn_id == policy_vocab["<|im_end|>"]
    prompt = teacher.tokenizer.apply_chat_template(
        [{"role": "user", "content": "x"}], tools=PI_TOOLS, tokenize=False)
    assert "For example, to list the files" in prompt  # SmolLM2's one-shot tool template


# --- through the real Pi CLI ------------------------------------------------------------------


def tool_calls_and_results(tokenizer: Any, segment: dict) -> list[tuple[dict, str]]:
    """(call, the tool result that came back) pairs of an agent segment, in order."""
    text = tokenizer.decode(segment["response_ids"])  # from the first answer on
    pairs = []
    for call, result in re.findall(
            r"<tool_call>\n(.*?)\n</tool_call>.*?<tool_response>\n(.*?)\n</tool_response>",
            text, re.S):
        pairs.append((json.loads(call), result))
    return pairs


@pytest.mark.slow
def test_teacher_demonstrations_pass_through_the_real_pi_cli(tiny_teacher):
    if shutil.which("npm") is None:
        pytest.skip("Pi installs with npm")
    family = TRAIN[:2]
    builtin = [t for t in BUILTIN if t.instance_id == "harness-gym__tabular-9"]  # 2 files

    def demonstrate(groups):  # one env per (churn, tasks) group; the two groups run at once
        done = []
        for churn, tasks in groups:
            teacher = TeacherEngine(tiny_teacher.tokenizer, max_context=tiny_teacher.max_context,
                                    stop_token_ids=tiny_teacher.stop_token_ids,
                                    scorer=tiny_teacher.scorer, churn=churn)
            env = gym.make("HarnessSWE-v0", harness="pi", tasks=tasks, engine=teacher,
                           sandbox="local", episode_timeout_s=300)
            group = []
            try:
                for task in tasks:
                    env.reset(options={"task_id": task.instance_id})
                    _, reward, _, _, info = env.step(None)
                    group.append((task, teacher.plan(task, AgentTools.from_specs(PI_TOOLS)), info))
            finally:
                env.close()
            done.append(group)
        return done

    groups = [(0.0, family[:1] + builtin), (1.0, family[1:])]
    infos = [run for group in in_threads(demonstrate, groups, workers=2) for run in group]

    for task, plan, info in infos:
        assert info["outcome"] == "passed", (info["error"], info["harness_output"]["tail"])
        assert changed_lines(info["patch"]) == changed_lines(task.patch)
        assert info["n_tool_calls"] == len(plan)
        (agent,) = [s for s in info["trace"] if s["role"] == "agent"]
        pairs = tool_calls_and_results(tiny_teacher.tokenizer, agent)
        assert [call["name"] for call, _ in pairs] == [
            {"ls": "bash", "test": "bash"}.get(step.kind, step.kind) for step in plan]
        for index, (call, _) in enumerate(pairs):  # every edit names text it read before
            for pair in call["arguments"].get("edits", []):
                assert any(pair["oldText"] in result for _, result in pairs[:index])
    assert len(infos[-1][1]) > 2  # the churned demonstration took needless steps


@pytest.mark.slow
def test_churned_symptom_demonstrations_take_more_tool_calls_and_still_pass_through_pi(
        tiny_teacher):
    """One symptom-tier task through the real Pi CLI, without and with churn."""
    if shutil.which("npm") is None:
        pytest.skip("Pi installs with npm")
    tools = AgentTools.from_specs(PI_TOOLS)

    def teacher(churn: float) -> TeacherEngine:
        return TeacherEngine(tiny_teacher.tokenizer, max_context=tiny_teacher.max_context,
                             stop_token_ids=tiny_teacher.stop_token_ids,
                             scorer=tiny_teacher.scorer, churn=churn)

    # a task whose churned plan runs the tests (the grader's pytest, in the agent's shell)
    task = next(t for t in SYMPTOM if Step("test") in teacher(1.0).plan(t, tools))

    def demonstrate(churns):  # the two episodes at once, each with its own engine and env
        done = []
        for churn in churns:
            engine = teacher(churn)
            env = gym.make("HarnessSWE-v0", harness="pi", tasks=[task], engine=engine,
                           sandbox="local", episode_timeout_s=300)
            try:
                env.reset(options={"task_id": task.instance_id})
                _, reward, _, _, info = env.step(None)
            finally:
                env.close()
            done.append((len(engine.plan(task, tools)), info))
        return done

    calls = {}
    for churn, (planned, info) in zip((0.0, 1.0), in_threads(demonstrate, [0.0, 1.0], workers=2)):
        assert info["outcome"] == "passed", (info["error"], info["harness_output"]["tail"])
        assert changed_lines(info["patch"]) == changed_lines(task.patch)
        assert info["n_tool_calls"] == planned
        calls[churn] = info["n_tool_calls"]
    assert calls[1.0] > calls[0.0] >= 4  # ls, read the front module, read the helper, edit


@pytest.mark.parametrize("task", BUILTIN, ids=lambda t: t.instance_id)
def test_asked_for_aiders_udiff_the_teacher_answers_with_the_gold_hunks_and_no_tool_call(
    tiny_teacher, task
):
    """aider has no tools: its system prompt asks for unified diffs (`UDIFF_REQUEST`)."""
    from harness_gym.engines.oracle import UDIFF_REQUEST

    tiny_teacher.add_tasks([task])
    messages = [{"role": "system", "content": f"Act as an expert developer; {UDIFF_REQUEST}."},
                {"role": "user", "content": task.problem_statement}]
    prompt = tiny_teacher.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_dict=False)
    completion = asyncio.run(tiny_teacher.generate(prompt, SamplingParams(max_tokens=8192)))
    assert completion.finish_reason == "stop"
    words, calls = parsed(tiny_teacher.tokenizer.decode(completion.token_ids[:-1]))
    assert calls == [] and words.startswith("I will fix ")
    blocks = re.findall(r"```diff\n(.*?)```", words, re.S)
    assert len(blocks) == len(parse_patch(task.patch))
    assert all(line.startswith(("---", "+++", "@@ ... @@", " ", "-", "+")) for block in blocks
               for line in block.splitlines())
    assert changed_lines("".join(blocks)) == changed_lines(task.patch)
