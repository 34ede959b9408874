"""`teacher`: a scripted coding agent whose episodes are demonstrations for a policy to learn.

Unlike the oracle (which pipes the gold patch into the shell in one blind call), the teacher
works the way a sensible agent does, through the harness's own tools: it reads the file(s) the
task is about (the ones its gold patch changes, in the order the problem statement mentions
them), edits each with old/new text taken from what the read returned (`text_edits`: the changed
lines, widened with context until unique), and then stops with a one-line answer. A model can
learn that: every token it is trained to emit follows from text in its context. When the text to
replace is not in what was read, the teacher says so and stops instead of guessing.

A seeded fraction of demonstrations (`churn`, default 0.3; chosen per task, so reruns agree)
also take one or two needless steps (`CHURN`): an `ls` first, reading a file twice, running the
tests before reading or after the fix, reading the fixed file again. That is tool churn for a
tool-call penalty to remove later (`teacher:smollm2,churn=0.6` churns on ~60% of tasks).

A CLI without tools (aider: it asks for edits in its udiff format, `harnesses/aider.py`) gets one
answer: "I will fix PATH." and a ```diff block per file, the gold patch's hunks under aider's
`@@ ... @@` headers. aider shows the model no file (no repo map, none added to its chat, and
without git it adds none a reply mentions), so this edit cannot be grounded in what was read:
it is the one demonstration the teacher writes blind, as the oracle does.

Symptom-tier tasks (`family-symptom:*`, whose statement names no file) start with `ls` and the
module the statement's call lives in (`family.entry`), whose import names the file to fix.

Its tokens are the POLICY's: `teacher:smollm2` answers in SmolLM2's tokenizer, and its tool calls
are the Hermes-style `<tool_call>` blocks the policy's chat template renders (the proxy renders
the prompts with that template too), so a trace is training data for that policy as it stands.
Logprobs: `teacher` (the tiny policy) reports the tiny model's real scores of its tokens, as the
oracle does. `teacher:smollm2` reports 0.0 by default: scoring re-reads the whole ~2k-token Pi
conversation with SmolLM2 at every call, which made an episode take ~100 s instead of ~12 s
on this 2-core machine (measured, 3 family tasks, Pi, bwrap), and a demonstration is not a
sample of the policy, so it has no p_old an importance ratio could use;
`teacher:smollm2,score=1` scores with the real model anyway.

Specs: `teacher` (= `teacher:tiny`), `teacher:smollm2`, `teacher:/path/to/model` (its
tokenizer and template), each optionally followed by `,churn=0.3`, `,seed=0`, `,score=0|1`.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

from .agent_tools import AgentTools, ToolCallText, tool_call_text
from .oracle import UDIFF_REQUEST
from .scripted import ScriptedEngine, task_key
from .text_edits import EditNotGrounded, FilePatch, parse_patch
from .transformers_engine import TransformersEngine, default_stop_token_ids

__all__ = ["Step", "TeacherEngine", "load_teacher_engine"]

StepKind = Literal["ls", "read", "edit", "write", "test"]
_TURN = re.compile(r"<\|im_start\|>(\w+)\n(.*?)(?=<\|im_start\|>|\Z)", re.S)
_TOOL_RESPONSE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.S)
TEST_COMMAND = "python -m pytest -q"
# Needless steps a churned demonstration takes: an `ls` first, the first file read twice, the
# tests run before anything is read or after the fix, the fixed file read again.
CHURN = ("ls", "reread", "test_first", "test_last", "reread_after")


@dataclass(frozen=True)
class Step:
    kind: StepKind
    path: str = ""


class TeacherEngine(ScriptedEngine):
    """The teacher for a policy: its tokenizer (with the policy's chat template), its context
    length and end-of-turn token; `scorer` (the policy's engine) fills in real logprobs."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        max_context: int,
        stop_token_ids: Sequence[int],
        scorer: TransformersEngine | None = None,
        churn: float = 0.3,
        seed: int = 0,
        model_name: str = "teacher",
        tokenizer_source: str | None = None,
    ) -> None:
        super().__init__(scorer, self._answer, model_name=model_name, tokenizer=tokenizer,
                         max_context=max_context, stop_token_ids=stop_token_ids,
                         tokenizer_source=tokenizer_source)
        if not 0.0 <= churn <= 1.0:
            raise ValueError(f"churn is a fraction of demonstrations, in [0, 1]; got {churn}")
        self.churn = churn
        self.seed = seed
        self._tasks: dict[str, Any] = {}

    def add_tasks(self, tasks: Iterable[Any]) -> None:
        """Register tasks (anything with `instance_id`, `problem_statement` and `patch`)."""
        for task in tasks:
            self._tasks[task_key(task.problem_statement)] = task

    def on_episode_start(self, task: Any) -> None:
        self.add_tasks([task])

    def plan(self, task: Any, tools: AgentTools) -> list[Step]:
        """The tool steps of `task`'s demonstration (the final answer follows them)."""
        files = _files_in_statement_order(task)
        steps = _entry_steps(task, files, tools)
        steps += [Step("read", f.path) for f in files if not f.new_file]
        steps += [Step("write" if f.new_file else "edit", f.path) for f in files]
        rng = random.Random(f"teacher:{self.seed}:{task.instance_id}")
        if rng.random() < self.churn:
            for extra in rng.sample(CHURN, rng.choice([1, 2])):
                _add_churn(steps, extra, tools)
        return steps

    # --- the script ---------------------------------------------------------------------------

    def _answer(self, prompt: str) -> str:
        task = next((t for key, t in self._tasks.items() if key in prompt), None)
        if task is None:
            return "I cannot solve this: the teacher found no registered task in the prompt."
        tools = AgentTools.from_prompt(prompt)
        if tools.shell is None and UDIFF_REQUEST in prompt:
            files = _files_in_statement_order(task)
            return f"I will fix {_paths([Step('edit', f.path) for f in files])}.\n\n" + \
                "".join(f.udiff() for f in files)
        steps = self.plan(task, tools)
        done = _exchanges(prompt, task_key(task.problem_statement))
        if len(done) >= len(steps):
            return f"I fixed the bug in {_paths(steps)}."
        step = steps[len(done)]
        try:
            lead, calls = self._move(step, steps, done, task, tools)
        except (EditNotGrounded, LookupError) as error:
            return f"I could not make the change: {error}"
        return lead + "\n" + "\n".join(tool_call_text(call) for call in calls)

    def _move(
        self, step: Step, steps: list[Step], done: list[list[str]], task: Any, tools: AgentTools
    ) -> tuple[str, list[ToolCallText]]:
        if step.kind == "ls":
            return "Let me look at the files first.", [tools.shell_call("ls")]
        if step.kind == "test":
            return "Let me run the tests.", [tools.shell_call(TEST_COMMAND)]
        if step.kind == "read":
            again = step in steps[: len(done)]
            lead = f"Let me read {step.path}{' again' if again else ''}."
            return lead, [tools.read_call(step.path)]
        patch = next(f for f in parse_patch(task.patch) if f.path == step.path)
        if step.kind == "write":
            return f"I will create {step.path}.", [tools.write_call(step.path, patch.new_content)]
        seen = _last_read(step.path, steps, done)
        if seen is None:
            raise LookupError(f"{step.path} was never read")
        edits = patch.edits(seen)
        return f"I will fix {step.path}.", tools.edit_calls(step.path, edits)


def load_teacher_engine(arg: str = "") -> TeacherEngine:
    """Entry point for `teacher[:POLICY][,churn=F][,seed=N][,score=0|1]`."""
    policy, *options = arg.split(",")
    policy = policy or "tiny"
    settings = {"churn": "0.3", "seed": "0", "score": "1" if policy == "tiny" else "0"}
    for option in options:
        key, sep, value = option.partition("=")
        if not sep or key not in settings:
            raise ValueError(f"unknown teacher option {option!r}; options: churn=, seed=, score=")
        settings[key] = value
    tokenizer, max_context, stops, scorer = _policy(policy, settings["score"] not in ("0", ""))
    return TeacherEngine(
        tokenizer, max_context=max_context, stop_token_ids=stops, scorer=scorer,
        churn=float(settings["churn"]), seed=int(settings["seed"]),
        model_name=f"teacher-{Path(policy).name}",
        # what `harness-gym trace` decodes its traces with: the policy's tokenizer
        tokenizer_source=policy if policy in ("tiny", "smollm2") else str(Path(policy).resolve()),
    )


def _policy(policy: str, score: bool) -> tuple[Any, int, list[int], TransformersEngine | None]:
    """(tokenizer with chat template, context length, stop ids, scoring engine or None)."""
    if policy == "tiny":
        from .tiny import MAX_CONTEXT, load_tiny_engine, load_tiny_tokenizer

        if score:
            engine = load_tiny_engine()
            return engine.tokenizer, engine.max_context, list(engine.stop_token_ids), engine
        tokenizer = load_tiny_tokenizer()
        stops = [tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.pad_token_id]
        return tokenizer, MAX_CONTEXT, stops, None
    if policy == "smollm2":
        from .chat_templates import SMOLLM2_TOOL_TEMPLATE
        from .smollm2 import load_smollm2_engine, smollm2_model_dir

        if score:
            engine = load_smollm2_engine()
            return engine.tokenizer, engine.max_context, list(engine.stop_token_ids), engine
        return (*_from_directory(smollm2_model_dir(), SMOLLM2_TOOL_TEMPLATE), None)
    directory = Path(policy).expanduser()
    if not directory.is_dir():
        raise ValueError(f"teacher policy {policy!r} is not tiny, smollm2 or a model directory")
    if score:
        engine = TransformersEngine.from_pretrained(directory)
        return engine.tokenizer, engine.max_context, list(engine.stop_token_ids), engine
    return (*_from_directory(directory, None), None)


def _from_directory(directory: Path, template: str | None) -> tuple[Any, int, list[int]]:
    """A model directory's tokenizer, context and stop tokens, without loading its weights."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    from .transformers_engine import _config_max_context

    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    if template is not None:
        tokenizer.chat_template = template
    try:
        generation = GenerationConfig.from_pretrained(directory, local_files_only=True)
    except OSError:  # no generation_config.json: the tokenizer's EOS and <|im_end|> decide
        generation = None
    config = AutoConfig.from_pretrained(directory, local_files_only=True)
    stops = default_stop_token_ids(SimpleNamespace(generation_config=generation), tokenizer)
    return tokenizer, _config_max_context(config), list(dict.fromkeys(stops))


# --- reading the conversation -------------------------------------------------------------------


def _exchanges(prompt: str, task_key: str) -> list[list[str]]:
    """The teacher's finished turns since the task's user turn: for each, the tool results
    that came back (in call order)."""
    turns = [(m[1], m[2]) for m in _TURN.finditer(prompt)]
    start = next((i for i, (role, text) in enumerate(turns) if role == "user" and task_key in text),
                 len(turns))
    exchanges: list[list[str]] = []
    for role, text in turns[start + 1 :]:
        if role == "assistant" and text.strip():  # the open generation prompt is empty
            exchanges.append([])
        elif exchanges:
            exchanges[-1].extend(_tool_text(r) for r in _TOOL_RESPONSE.findall(text))
    return exchanges


def _tool_text(response: str) -> str:
    """A tool result's text; harnesses that send JSON (Hermes) carry it in one field."""
    try:
        value = json.loads(response)
    except json.JSONDecodeError:
        return response
    if isinstance(value, dict):
        for key in ("content", "output", "stdout", "result"):
            if isinstance(value.get(key), str):
                return value[key]
    return response


def _last_read(path: str, steps: list[Step], done: list[list[str]]) -> str | None:
    for index in range(len(done) - 1, -1, -1):
        if steps[index] == Step("read", path) and done[index]:
            return done[index][0]
    return None


def _files_in_statement_order(task: Any) -> list[FilePatch]:
    files = [f for f in parse_patch(task.patch) if not f.deleted]
    statement = task.problem_statement

    def mention(f: FilePatch) -> int:
        at = statement.find(f.path)
        return at if at >= 0 else len(statement)

    return sorted(files, key=mention)


def _entry_steps(task: Any, files: list[FilePatch], tools: AgentTools) -> list[Step]:
    """A symptom-tier task (`family.entry`: the module the statement's call lives in, which the
    fix does not touch): list the repo, then read that module, whose import names the file to
    fix; so every path the teacher opens was in its context first."""
    extra = getattr(task, "extra", None) or {}
    entry = (extra.get("family") or {}).get("entry")
    if not entry or entry in {f.path for f in files}:
        return []
    return [Step("ls")] * bool(tools.shell) + [Step("read", entry)]


def _add_churn(steps: list[Step], extra: str, tools: AgentTools) -> None:
    """Put one needless step of kind `extra` (see `CHURN`) into `steps`, in place."""
    reads = [i for i, s in enumerate(steps) if s.kind == "read"]
    changes = [i for i, s in enumerate(steps) if s.kind in ("edit", "write")]
    if extra == "ls" and tools.shell:
        steps.insert(0, Step("ls"))
    elif extra == "reread" and reads:
        steps.insert(reads[0] + 1, steps[reads[0]])
    elif extra == "test_first" and tools.shell:
        steps.insert(reads[0] if reads else 0, Step("test"))
    elif extra == "test_last" and tools.shell:
        steps.append(Step("test"))
    elif extra == "reread_after" and changes and steps[changes[-1]].kind == "edit":
        steps.insert(changes[-1] + 1, Step("read", steps[changes[-1]].path))


def _paths(steps: list[Step]) -> str:
    paths = list(dict.fromkeys(s.path for s in steps if s.kind in ("edit", "write")))
    return ", ".join(paths) or "the repository"
