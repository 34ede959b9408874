"""`oracle` and `oracle:noop`: scripted policies for tests and demonstrations.

The oracle reads which task the conversation is about (a registered task's problem statement
appears in the prompt), finds the harness's shell tool in the prompt's tool list (`bash`, `Bash`,
`terminal`, ...: whatever the CLI calls it), applies the task's gold patch through that tool, and
then answers that it is done. `oracle:noop` answers "done" at once without touching the repo.
Tokens come from the tiny tokenizer and logprobs are the tiny model's real scores of them
(see `ScriptedEngine`), so their traces are as real as a sampled policy's.

Each episode registers its task through `Engine.on_episode_start` (or `add_tasks` for several
at once); nothing else needs to know the answers.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .agent_tools import AgentTools, tool_call_text
from .scripted import ScriptedEngine, task_key
from .transformers_engine import TransformersEngine

DONE = "The fix is applied and the tests should pass now."
# mini-swe-agent ends an episode only when the model runs this command (a plain "done" answer is
# a format error it asks again about): where the prompt says so, the oracle finishes that way.
SUBMIT_COMMAND = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
# aider has no tools: it asks for edits as unified diffs in its system prompt (its `udiff` edit
# format, `harnesses/aider.py`), and applies the ```diff blocks of the answer itself.
UDIFF_REQUEST = "write out the changes similar to a unified diff like `diff -U0` would produce"


class OracleEngine(ScriptedEngine):
    def __init__(self, scorer: TransformersEngine, *, noop: bool = False) -> None:
        super().__init__(scorer, self._answer, model_name="oracle-noop" if noop else "oracle")
        self.noop = noop
        self._patches: dict[str, str] = {}

    def add_tasks(self, tasks: Iterable[Any]) -> None:
        """Register tasks (anything with `problem_statement` and `patch`)."""
        for task in tasks:
            self._patches[task_key(task.problem_statement)] = task.patch

    def on_episode_start(self, task: Any) -> None:
        self.add_tasks([task])

    def _answer(self, prompt: str) -> str:
        tools = AgentTools.from_prompt(prompt)
        if self.noop:
            return _finish(prompt, tools, "Done.")
        patch = next((p for key, p in self._patches.items() if key in prompt), None)
        if patch is not None and tools.shell is None and UDIFF_REQUEST in prompt:
            return f"I will apply the fix.\n\n{udiff_blocks(patch)}\n{DONE}"
        if patch is None or tools.shell is None:
            missing = "task" if patch is None else "shell tool"
            return f"I cannot solve this: the oracle found no registered {missing} in the prompt."
        if "<tool_response>" in prompt:  # our one call has run
            return _finish(prompt, tools, DONE)
        command = f"git apply --whitespace=nowarn <<'HARNESS_GYM_PATCH'\n{patch}HARNESS_GYM_PATCH"
        return f"I will apply the fix.\n{tool_call_text(tools.shell_call(command))}"


def _finish(prompt: str, tools: AgentTools, text: str) -> str:
    """`text`, or the CLI's own way to end its episode where its prompt names one."""
    if SUBMIT_COMMAND in prompt and tools.shell is not None:
        return f"{text}\n{tool_call_text(tools.shell_call(SUBMIT_COMMAND))}"
    return text


def udiff_blocks(patch: str) -> str:
    """A git patch as aider's udiff answer: one ```diff block per file, from its `---` line on
    (aider reads `diff --git` and `index` lines as hunk text)."""
    blocks = []
    for part in patch.split("diff --git ")[1:]:
        lines = part.splitlines(keepends=True)
        start = next(i for i, line in enumerate(lines) if line.startswith("--- "))
        blocks.append("```diff\n" + "".join(lines[start:]).rstrip("\n") + "\n```\n")
    return "".join(blocks)


def load_oracle_engine(arg: str = "") -> OracleEngine:
    if arg not in ("", "noop"):
        raise ValueError(f"unknown oracle variant {arg!r}: use 'oracle' or 'oracle:noop'")
    from .tiny import load_tiny_engine

    return OracleEngine(load_tiny_engine(), noop=arg == "noop")
