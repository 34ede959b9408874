"""Warm start from traces: a trace segment becomes one SFT row with its exact token ids and
labels masked by its loss_mask; TRL's SFTTrainer takes those rows as they are and its loss
counts only the unmasked positions; and a short run on real teacher traces through the real Pi
CLI (recorded by RecordTraces) lowers the loss on them."""

from __future__ import annotations

import json
import shutil
from typing import Any

import gymnasium as gym
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import harness_gym  # noqa: F401  (registers HarnessSWE-v0)
from harness_gym.engines.teacher import TeacherEngine
from harness_gym.engines.tiny import load_tiny_engine, tiny_model_dir
from harness_gym.training.sft import (
    IGNORE_INDEX,
    TraceFormatError,
    load_episodes,
    masked_nll,
    segment_row,
    sft_dataset,
    sft_rows,
    sft_trainer,
    train_sft,
    turn_opening_nll,
    validation_split,
)
from harness_gym.tasks import load_tasks
from harness_gym.wrappers import RecordTraces
from harness_gym.wrappers.record_traces import SCHEMA


def segment(role: str = "agent", prompt: int = 5, calls: int = 2) -> dict[str, Any]:
    """A segment shaped like the proxy's: sampled tokens (mask 1) and inserted tool results
    (mask 0) alternating after the prompt."""
    response, mask = [], []
    for call in range(calls):
        if call:
            response += [900 + call] * 3  # a tool result the proxy inserted
            mask += [0] * 3
        response += [100 + call * 10 + i for i in range(4)]
        mask += [1] * 4
    return {"role": role, "prompt_ids": list(range(1, prompt + 1)), "response_ids": response,
            "loss_mask": mask, "response_logprobs": [-0.5 if m else 0.0 for m in mask],
            "policy_version": 0, "policy_versions": [0] * calls}


def episode(task_id: str, outcome: str = "passed", *segments: dict) -> dict[str, Any]:
    return {"task_id": task_id, "outcome": outcome, "trace": list(segments or [segment()])}


def test_a_row_is_the_segments_exact_ids_with_labels_masked_by_its_loss_mask():
    seg = segment(prompt=6, calls=3)
    row = segment_row(seg)
    assert row["input_ids"] == seg["prompt_ids"] + seg["response_ids"]
    assert row["labels"][:6] == [IGNORE_INDEX] * 6  # the prompt carries no loss
    for token, bit, label in zip(seg["response_ids"], seg["loss_mask"], row["labels"][6:],
                                 strict=True):
        assert label == (token if bit else IGNORE_INDEX)  # nor do inserted tool results
    assert sum(label != IGNORE_INDEX for label in row["labels"]) == sum(seg["loss_mask"])


@pytest.mark.parametrize(("change", "message"), [
    ({"loss_mask": [1, 1]}, "covers its response tokens one to one"),
    ({"loss_mask": [2] * 11}, "other than 0 and 1"),
])
def test_a_segment_that_breaks_the_trace_contract_is_refused(change, message):
    with pytest.raises(TraceFormatError, match=message):
        segment_row({**segment(), **change})


def test_passing_agent_segments_are_kept_by_default():
    no_loss = {**segment(), "loss_mask": [0] * 11}
    episodes = [
        episode("a", "passed", segment(), segment(role="auxiliary"), no_loss),
        episode("b", "failed"),
        episode("c", "timeout"),
        episode("d", "passed", segment(prompt=50)),
    ]
    assert [(r["task_id"], r["segment"]) for r in sft_rows(episodes)] == [("a", 0), ("d", 0)]
    assert [r["task_id"] for r in sft_rows(episodes, outcomes=None)] == ["a", "b", "c", "d"]
    assert [r["task_id"] for r in sft_rows(episodes, max_length=30)] == ["a"]  # never cut
    assert len(sft_rows(episodes, roles=("agent", "auxiliary"))) == 3
    assert sft_dataset(episodes).column_names[:2] == ["input_ids", "labels"]
    with pytest.raises(ValueError, match="no training rows"):
        sft_dataset([episode("b", "failed")])


def test_episodes_load_from_record_traces_parquet_and_jsonl_files_and_directories(tmp_path):
    episodes = [episode("a"), episode("b", "failed")]
    rows = [{**{name: None for name in SCHEMA.names}, **e} for e in episodes]
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), tmp_path / "run.parquet")
    (tmp_path / "run.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes))

    for name in ("run.parquet", "run.jsonl"):
        loaded = load_episodes(tmp_path / name)
        assert [e["task_id"] for e in loaded] == ["a", "b"]
        assert sft_rows(tmp_path / name) == sft_rows(episodes)
    assert len(load_episodes(tmp_path)) == 4
    with pytest.raises(ValueError, match=".jsonl or .parquet"):
        load_episodes(tmp_path / "run.txt")


@pytest.fixture(scope="module")
def tiny_model() -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir())


@pytest.fixture(scope="module")
def tiny_tokenizer() -> Any:
    from harness_gym.engines import load_tiny_tokenizer

    return load_tiny_tokenizer()


def test_the_trainers_loss_counts_only_the_unmasked_positions(tiny_model, tiny_tokenizer,
                                                              tmp_path):
    rows = sft_rows([episode("a", "passed", segment(prompt=7, calls=3)),
                     episode("b", "passed", segment(prompt=4, calls=2))])
    trainer = sft_trainer(tiny_model, tiny_tokenizer, rows, output_dir=tmp_path)
    prepared = [trainer.train_dataset[i] for i in range(2)]
    assert [p["input_ids"] for p in prepared] == [r["input_ids"] for r in rows]  # not re-tokenized
    assert [p["labels"] for p in prepared] == [r["labels"] for r in rows]
    batch = trainer.data_collator(prepared)  # padded: the shorter row's tail is -100 too

    trainer.model.eval()
    with torch.no_grad():
        loss = float(trainer.compute_loss(trainer.model, dict(batch)))
        logits = trainer.model(input_ids=batch["input_ids"],
                               attention_mask=batch["attention_mask"]).logits
    predictions, targets = logits[:, :-1].reshape(-1, logits.shape[-1]), batch["labels"][:, 1:]
    targets = targets.reshape(-1)
    per_token = torch.nn.functional.cross_entropy(predictions, targets.clamp(min=0),
                                                  reduction="none")
    kept = targets != IGNORE_INDEX
    assert int(kept.sum()) == sum(sum(segment(prompt=p, calls=c)["loss_mask"])
                                  for p, c in ((7, 3), (4, 2)))
    assert loss == pytest.approx(float(per_token[kept].mean()), rel=1e-4)
    assert loss != pytest.approx(float(per_token[batch["attention_mask"][:, 1:].reshape(-1) == 1]
                                       .mean()), rel=1e-3)  # masking changed the loss


@pytest.mark.slow
def test_sft_on_real_teacher_traces_through_pi_lowers_their_loss(tiny_tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    if shutil.which("npm") is None:
        pytest.skip("Pi installs with npm")
    tasks = load_tasks("family:train")[:3]
    scorer = load_tiny_engine()
    teacher = TeacherEngine(scorer.tokenizer, max_context=scorer.max_context,
                            stop_token_ids=scorer.stop_token_ids, scorer=scorer, churn=0.0)
    vec = gym.make_vec("HarnessSWE-v0", num_envs=3, vectorization_mode="vector_entry_point",
                       harness="pi", tasks=tasks, engine=teacher, sandbox="local",
                       episode_timeout_s=300, progress=False)
    envs = RecordTraces(vec, tmp_path / "runs", format="parquet")
    try:
        envs.reset(seed=0, options={"task_ids": [t.instance_id for t in tasks]})
        _, _, _, _, infos = envs.step(None)
    finally:
        envs.close()
        teacher.close()
    assert list(infos["outcome"]) == ["passed"] * 3

    rows = sft_rows(envs.file)
    assert len(rows) == 3
    for row, trace in zip(rows, infos["trace"], strict=True):
        (agent,) = [s for s in trace if s["role"] == "agent"]
        assert row["input_ids"] == agent["prompt_ids"] + agent["response_ids"]  # the same ids
        assert sum(label != IGNORE_INDEX for label in row["labels"]) == sum(agent["loss_mask"])

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir())
    before = masked_nll(model, rows)
    trainer = train_sft(model, tiny_tokenizer, rows, output_dir=tmp_path / "sft",
                        num_train_epochs=2, learning_rate=3e-3)
    after = masked_nll(trainer.model, rows)
    assert after < 0.85 * before, (before, after)
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert losses[-1] < losses[0]


def test_a_validation_split_holds_out_whole_demonstrations_drawn_by_the_seed():
    episodes = [episode(f"t{i}", "passed", segment(), segment(prompt=6)) for i in range(10)]
    rows = sft_rows(episodes)
    train, held_out = validation_split(rows, 0.2, seed=3)
    held_tasks = {r["task_id"] for r in held_out}
    assert len(held_tasks) == 2 and len(held_out) == 4  # both rows of each held-out episode
    assert not held_tasks & {r["task_id"] for r in train} and len(train) == 16
    assert validation_split(rows, 0.2, seed=3) == (train, held_out)
    assert len({r["task_id"] for r in validation_split(rows, 0.01, seed=3)[1]}) == 1
    assert len({r["task_id"] for r in validation_split(rows, 0.99, seed=3)[0]}) == 1
    with pytest.raises(ValueError, match="two demonstrations"):
        validation_split(sft_rows([episode("only")]), 0.5)


def test_sft_with_held_out_demos_ends_with_the_checkpoint_of_their_lowest_loss(tiny_tokenizer,
                                                                               tmp_path):
    """Training rows teach one answer, the held-out rows another: the held-out loss soon
    rises, early stopping ends the run two checkpoints after its lowest, and the model the
    trainer ends with is that checkpoint's, not the last (LoRA, frozen prefix: as the learning
    curve trains)."""
    from transformers import AutoModelForCausalLM, TrainerCallback

    from harness_gym.training.lora import LoraSpec

    prompt = list(range(10, 40))

    def rows(answer: int, tasks: str) -> list[dict[str, Any]]:
        return [{"input_ids": prompt + [answer] * 6, "labels": [IGNORE_INDEX] * 30 + [answer] * 6,
                 "task_id": f"{tasks}{i}"} for i in range(2)]

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir())
    trainer = sft_trainer(model, tiny_tokenizer, rows(101, "train"), output_dir=tmp_path,
                          eval_rows=rows(202, "held"), patience=2, frozen_prefix=True,
                          lora=LoraSpec(rank=4), max_steps=10, learning_rate=5e-2,
                          save_strategy="steps", save_steps=1, save_total_limit=1, seed=0)
    own = []  # the held-out loss of the model as it is at each evaluation, without any cache

    class Measure(TrainerCallback):
        def on_evaluate(self, *args: Any, **kw: Any) -> None:
            own.append(masked_nll(trainer.model, rows(202, "held")))

    trainer.add_callback(Measure())
    trainer.train()
    evaluations = [e for e in trainer.state.log_history if "eval_loss" in e]
    losses = [e["eval_loss"] for e in evaluations]
    # each step's prefix is its own weights' (fused AdamW leaves the version counters alone)
    assert losses == pytest.approx(own, rel=1e-5)
    best = losses.index(min(losses)) + 1
    assert [e["step"] for e in evaluations] == list(range(1, len(losses) + 1))  # each checkpoint
    assert len(losses) == best + 2  # stopped: 2 checkpoints without a new lowest
    assert trainer.state.global_step == best + 2 < trainer.state.max_steps
    assert trainer.state.best_model_checkpoint.endswith(f"checkpoint-{best}")
    assert trainer.state.best_metric == min(losses) < losses[-1]
    # the weights it ends with are the best checkpoint's: the held-out loss measured again
    assert masked_nll(trainer.model, rows(202, "held")) == pytest.approx(min(losses), rel=1e-5)
    with pytest.raises(ValueError, match="eval_rows"):
        sft_trainer(model, tiny_tokenizer, rows(101, "x"), output_dir=tmp_path, patience=2)


def test_turn_opening_nll_separates_each_turns_first_token_from_the_rest():
    """Two turns (loss tokens 5-8 and 12-14) in one row, one turn in another: each opening's NLL
    is the full forward's at that position, and the three means recombine into `masked_nll`."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir(), dtype=torch.float32)
    ids = list(range(300, 316))
    two_turns = [IGNORE_INDEX] * 5 + ids[5:9] + [IGNORE_INDEX] * 3 + ids[12:15] + [IGNORE_INDEX]
    one_turn = [IGNORE_INDEX] * 10 + ids[10:]
    rows = [{"input_ids": ids, "labels": two_turns}, {"input_ids": ids, "labels": one_turn}]
    with torch.no_grad():
        logps = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
    nll = {t: -float(logps[t - 1, ids[t]]) for t in range(1, len(ids))}

    got = turn_opening_nll(model, rows)

    assert got["first_turn"] == pytest.approx((nll[5] + nll[10]) / 2, abs=1e-5)
    assert got["later_turns"] == pytest.approx(nll[12], abs=1e-5)
    rest = [nll[t] for t in (6, 7, 8, 13, 14, 11, 12, 13, 14, 15)]
    assert got["rest"] == pytest.approx(sum(rest) / len(rest), abs=1e-5)
    total = nll[5] + nll[10] + nll[12] + sum(rest)
    assert masked_nll(model, rows) == pytest.approx(total / 13, abs=1e-5)
    assert turn_opening_nll(model, rows[1:])["later_turns"] is None
