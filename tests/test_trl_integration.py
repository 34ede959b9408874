"""TRL's real `GRPOTrainer` trains the tiny model on real Pi episodes through `rollout_func`.

One module-scoped run (2 optimisation steps on the CPU, one generation batch of 2 tasks x 2
rollouts, ~35 s) backs the tests; a spy on `_generate_and_score_completions` keeps what TRL
built from the rollouts, so the tests can compare TRL's own re-computed logprobs with the trace's.
"""

from __future__ import annotations

import math
import shutil
from types import SimpleNamespace
from typing import Any

import pytest
import torch

pytest.importorskip("trl")
from transformers import AutoModelForCausalLM
from trl import GRPOConfig, GRPOTrainer

from harness_gym.engines.tiny import load_tiny_tokenizer, tiny_model_dir
from harness_gym.integrations.trl import (
    harness_reward,
    make_rollout_func,
    task_dataset,
    training_segment,
)


def alternating_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """1, 0, 1, 0, ...: the tiny model's episodes all fail alike, and this gives every group a
    reward spread, hence nonzero advantages and a real gradient."""
    return [float(i % 2 == 0) for i in range(len(completions))]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if shutil.which("npm") is None:
        pytest.skip("Pi installs with npm")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir(), dtype=torch.float32)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    rollout = make_rollout_func(harness="pi", tasks="builtin", max_tokens=32,
                                episode_timeout_s=120)
    args = GRPOConfig(
        output_dir=str(tmp_path_factory.mktemp("grpo")), per_device_train_batch_size=2,
        num_generations=2, max_steps=2, learning_rate=1e-2, logging_steps=1,
        # One generation feeds two steps, so TRL re-computes "old" logprobs (its only path to
        # them without vLLM), which the trace's p_old must match.
        steps_per_generation=2, gradient_accumulation_steps=1,
        temperature=1.0, beta=0.0, max_completion_length=32, report_to="none", use_cpu=True,
        bf16=False, save_strategy="no", seed=0,
    )
    trainer = GRPOTrainer(
        model=model, processing_class=load_tiny_tokenizer(), args=args,
        train_dataset=task_dataset("builtin").select(range(2)),
        reward_funcs=[harness_reward, alternating_reward], rollout_func=rollout,
    )
    calls: list[dict[str, Any]] = []
    generated: list[dict[str, Any]] = []
    original_rollout = trainer.rollout_func
    original_generate = trainer._generate_and_score_completions

    def spy_rollout(prompts: list[Any], t: Any) -> dict[str, Any]:
        out = original_rollout(prompts, t)
        calls.append({"prompts": prompts, "out": out, "infos": rollout.last_infos})
        return out

    def spy_generate(inputs: list[dict[str, Any]]) -> dict[str, Any]:
        out = original_generate(inputs)
        generated.append(out)
        return out

    trainer.rollout_func = spy_rollout
    trainer._generate_and_score_completions = spy_generate
    try:
        result = trainer.train()
    finally:
        rollout.close()
    return {"trainer": trainer, "model": model, "before": before, "calls": calls,
            "generated": generated, "result": result, "rollout": rollout}


def test_two_grpo_steps_run_on_harness_rollouts_with_a_finite_loss(run):
    trainer = run["trainer"]
    assert trainer.state.global_step == 2
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    assert math.isfinite(run["result"].training_loss)


def test_the_update_changes_the_trainers_own_model(run):
    moved = [k for k, v in run["model"].named_parameters()
             if not torch.equal(v.detach(), run["before"][k])]
    assert moved, "nonzero advantages must move the weights"


def test_each_prompt_row_is_one_pi_episode_grouped_by_task(run):
    (call,) = run["calls"]  # one generation batch for both steps
    prompts, out, infos = call["prompts"], call["out"], call["infos"]
    assert len(prompts) == 4 and prompts[0] == prompts[1] and prompts[2] == prompts[3]
    assert all(len(out[k]) == 4 for k in out)
    assert out["task_id"][0] == out["task_id"][1] != out["task_id"][2] == out["task_id"][3]
    assert set(infos["harness"]) == {"pi"}
    assert set(out["outcome"]) <= {"failed", "harness_error", "timeout"}  # tiny writes gibberish
    assert all(v == 0 for v in out["policy_version"])  # served before the first update
    assert all(n >= 1 for n in infos["n_llm_calls"])


def test_rows_are_the_traces_training_segment_token_for_token(run):
    (call,) = run["calls"]
    out, infos = call["out"], call["infos"]
    for i in range(4):
        segment = training_segment(infos["trace"][i])
        assert out["prompt_ids"][i] == segment["prompt_ids"]
        assert out["completion_ids"][i] == segment["response_ids"]
        assert out["logprobs"][i] == segment["response_logprobs"]
        assert out["env_mask"][i] == segment["loss_mask"]
        assert len(out["logprobs"][i]) == len(out["completion_ids"][i])
        assert 0 < len(out["completion_ids"][i]) <= 32  # max_tokens capped the call


def test_trls_recomputed_old_logprobs_match_the_traces_p_old(run):
    (batch,) = run["generated"]
    mask = (batch["completion_mask"] * batch["tool_mask"]).bool()
    assert mask.sum() > 0
    ratio = torch.exp(batch["old_per_token_logps"] - batch["sampling_per_token_logps"])[mask]
    assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-4), ratio.max()


def test_advantages_are_nonzero_and_the_envs_are_closed_at_train_end(run):
    (batch,) = run["generated"]
    assert batch["advantages"].abs().sum() > 0
    assert run["rollout"]._envs == {} and run["rollout"]._engine is None


def test_a_prompt_names_its_task_by_id_statement_or_conversation():
    rollout = make_rollout_func(tasks="builtin")
    task = rollout.tasks[3]
    assert rollout.task_for(task.instance_id) is task
    assert rollout.task_for("  " + task.problem_statement + "\n") is task
    assert rollout.task_for([{"role": "system", "content": "x"},
                             {"role": "user", "content": [{"type": "text",
                                                           "text": f"solve {task.instance_id}"}]}]) is task
    with pytest.raises(ValueError, match="names no task"):
        rollout.task_for("write me a poem")


def test_the_training_segment_is_the_agent_segment_with_the_most_sampled_tokens():
    def segment(role: str, mask: list[int]) -> dict[str, Any]:
        return {"role": role, "loss_mask": mask}

    small, big = segment("agent", [1, 0, 1]), segment("agent", [1, 1, 0, 1])
    trace = [small, segment("discarded", [1] * 9), big, segment("auxiliary", [1] * 9)]
    assert training_segment(trace) is big
    assert training_segment([segment("discarded", [1])]) is None
    assert training_segment([]) is None


def test_task_dataset_has_a_prompt_and_task_id_per_row():
    n_tasks = len(make_rollout_func(tasks="builtin").tasks)
    rows = task_dataset("builtin", repeat=2, conversational=True)
    assert len(rows) == 2 * n_tasks and rows.column_names == ["prompt", "task_id"]
    assert rows[0]["prompt"][0]["role"] == "user"


def test_an_engine_spec_serves_the_rollouts_instead_of_the_trainers_model():
    if shutil.which("npm") is None:
        pytest.skip("Pi installs with npm")
    trainer = SimpleNamespace(  # what rollout_func reads of a GRPOTrainer
        model=None, num_generations=2, state=SimpleNamespace(global_step=7),
        args=SimpleNamespace(temperature=1.0, top_p=1.0, top_k=None, max_completion_length=4096))
    with make_rollout_func(harness="pi", engine="oracle", tasks="builtin") as rollout:
        task = rollout.tasks[0]
        out = rollout([task.instance_id] * 2, trainer)
    assert out["outcome"] == ["passed", "passed"] and min(out["reward"]) > 0.9
    assert out["policy_version"] == [7, 7] and out["task_id"] == [task.instance_id] * 2
    assert all(0 in mask and 1 in mask for mask in out["env_mask"])  # the tool result is masked
