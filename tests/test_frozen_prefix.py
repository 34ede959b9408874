"""Training with a frozen, shared prefix: the loss values are the full-sequence ones, the
gradient is exactly the full gradient with the prefix's keys and values held constant (checked
against an independent full forward that detaches them), shared prefixes are computed once per
weight version, and TRL's SFT and GRPO trainers get the same numbers through it."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from harness_gym.engines.tiny import load_tiny_tokenizer, tiny_model_dir
from harness_gym.training import FrozenPrefixScorer

pytest.importorskip("trl")


def tiny_model() -> Any:
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir(), dtype=torch.float32)


def row(n: int = 80, seed: int = 0) -> list[int]:
    return torch.randint(5, 3000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def grads(model: Any) -> dict[str, torch.Tensor]:
    out = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    return out


def full_logprobs(model: Any, ids: list[int], start: int, detach_before: int = 0) -> torch.Tensor:
    """An independent reference: one forward over the whole row; with `detach_before`, every
    layer's key and value projections at positions < detach_before are cut from the graph."""
    hooks = []
    if detach_before:
        def cut(module: Any, args: Any, output: torch.Tensor) -> torch.Tensor:
            return torch.cat([output[:, :detach_before].detach(), output[:, detach_before:]], 1)

        for name, module in model.named_modules():
            if name.endswith(("k_proj", "v_proj")):
                hooks.append(module.register_forward_hook(cut))
    try:
        logits = model(input_ids=torch.tensor([ids])).logits[0, start - 1:-1]
    finally:
        for hook in hooks:
            hook.remove()
    return torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(ids[start:])[:, None])[:, 0]


def test_the_loss_is_the_full_ones_and_the_gradient_holds_the_prefix_kv_constant():
    model = tiny_model()
    ids, start = row(80), 60
    weights = torch.linspace(0.5, 1.5, len(ids) - start)  # any loss over the scored tokens

    logps, _ = FrozenPrefixScorer(model).token_logprobs(ids, start)
    (logps * weights).sum().backward()
    frozen = grads(model)

    reference = full_logprobs(model, ids, start, detach_before=start - 1)
    assert torch.allclose(logps, reference, atol=1e-5)
    (reference * weights).sum().backward()
    cut = grads(model)

    (full_logprobs(model, ids, start) * weights).sum().backward()
    whole = grads(model)

    assert frozen.keys() == cut.keys()
    for name in frozen:
        assert torch.allclose(frozen[name], cut[name], atol=1e-5, rtol=1e-4), name
    # ...and the dropped paths are real: the full gradient differs
    assert any(not torch.allclose(frozen[n], whole[n], atol=1e-5, rtol=1e-4) for n in frozen)


def test_rows_sharing_a_prefix_compute_it_once_per_weight_version():
    model = tiny_model()
    scorer = FrozenPrefixScorer(model)
    shared = row(50, seed=1)
    a, b = shared + row(30, seed=2), shared + row(30, seed=3)
    scorer.token_logprobs(a, 70)
    assert scorer.frozen_tokens == 69
    scorer.token_logprobs(b, 70)
    assert scorer.frozen_tokens == 69 + 19  # only what follows the shared 50
    assert scorer.grad_tokens == 2 * 10  # positions 69..78 predict tokens 70..79

    logps, _ = scorer.token_logprobs(a, 70)  # all 69 cached now
    assert scorer.frozen_tokens == 88
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    logps.sum().backward()
    optimizer.step()
    after, _ = scorer.token_logprobs(a, 70)
    assert scorer.frozen_tokens == 88 + 69  # new weights: computed again
    assert torch.allclose(after, full_logprobs(model, a, 70), atol=1e-5)


def test_temperature_and_entropy_are_those_of_the_scaled_distribution():
    model = tiny_model()
    ids, start = row(40), 30
    logps, entropy = FrozenPrefixScorer(model).token_logprobs(ids, start, temperature=0.7,
                                                              entropy=True)
    with torch.no_grad():
        scaled = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, start - 1:-1]
                                   / 0.7, -1)
    assert torch.allclose(logps, scaled.gather(1, torch.tensor(ids[start:])[:, None])[:, 0],
                          atol=1e-5)
    assert torch.allclose(entropy, -(scaled.exp() * scaled).sum(-1), atol=1e-4)
    with pytest.raises(ValueError, match="start must be"):
        FrozenPrefixScorer(model).token_logprobs(ids, 0)


def test_only_the_scored_positions_get_logits_and_the_gradient_is_the_masked_ones():
    ids, start = row(80), 60
    scored = torch.tensor([i % 3 != 1 for i in range(len(ids) - start)])
    weights = torch.linspace(0.5, 1.5, len(ids) - start)
    model = tiny_model()

    every, every_entropy = FrozenPrefixScorer(model).token_logprobs(ids, start, entropy=True)
    (every * weights * scored).sum().backward()
    masked_grads = grads(model)
    some, some_entropy = FrozenPrefixScorer(model).token_logprobs(ids, start, entropy=True,
                                                                  scored=scored)
    (some * weights).sum().backward()
    assert torch.allclose(some[scored], every[scored], atol=1e-6)
    assert torch.allclose(some_entropy[scored], every_entropy[scored], atol=1e-5)
    assert (some[~scored] == 0).all() and (some_entropy[~scored] == 0).all()
    for name, grad in grads(model).items():
        assert torch.allclose(grad, masked_grads[name], atol=1e-6), name
    with pytest.raises(ValueError, match="scored has 19 flags for 20 loss positions"):
        FrozenPrefixScorer(model).token_logprobs(ids, start, scored=scored[:-1])


def test_training_recomputes_each_mlp_in_the_backward_pass_and_the_gradient_is_unchanged(
        monkeypatch):
    ids, start = row(80), 50
    model = tiny_model()
    runs = []
    mlp_type = type(model.model.layers[0].mlp)
    forward = mlp_type.forward

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        runs.append(1)
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(mlp_type, "forward", counted)
    by_mode = {}
    for training in (False, True):
        model.train(training)
        logps, _ = FrozenPrefixScorer(model).token_logprobs(ids, start)
        before = len(runs)
        logps.sum().backward()
        by_mode[training] = (len(runs) - before, grads(model))
    layers = len(model.model.layers)
    assert by_mode[False][0] == 0 and by_mode[True][0] == layers  # again only when training
    for name, grad in by_mode[True][1].items():
        assert torch.allclose(grad, by_mode[False][1][name], atol=1e-6), name
    assert "forward" not in model.model.layers[0].mlp.__dict__  # the model is left as it was


def test_the_frozen_prefix_sft_loss_equals_the_full_masked_loss(tmp_path):
    from harness_gym.training.sft import sft_rows, sft_trainer

    def episode(seed: int) -> dict[str, Any]:
        prompt, response = row(40, seed), row(20, seed + 10)
        mask = [1] * 6 + [0] * 8 + [1] * 6
        return {"task_id": str(seed), "outcome": "passed", "trace": [{
            "role": "agent", "prompt_ids": prompt, "response_ids": response, "loss_mask": mask,
            "response_logprobs": [0.0] * 20, "policy_version": 0}]}

    rows = sft_rows([episode(1), episode(2)])
    rows[1] = {**rows[1], "input_ids": rows[1]["input_ids"][:-5], "labels": rows[1]["labels"][:-5]}
    tokenizer = load_tiny_tokenizer()
    losses = []
    for frozen in (False, True):
        trainer = sft_trainer(tiny_model(), tokenizer, rows, output_dir=tmp_path / str(frozen),
                              frozen_prefix=frozen, per_device_train_batch_size=2)
        batch = trainer.data_collator([trainer.train_dataset[i] for i in range(2)])
        trainer.model.eval()
        with torch.no_grad():
            losses.append(float(trainer.compute_loss(trainer.model, dict(batch))))
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)


def test_the_frozen_prefix_grpo_trainer_scores_completions_as_trl_does(tmp_path):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from harness_gym.training.trainers import FrozenPrefixGRPOTrainer

    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2,
                      num_generations=2, max_completion_length=16, temperature=0.8,
                      report_to="none", use_cpu=True, bf16=False)
    trainer = FrozenPrefixGRPOTrainer(
        model=tiny_model(), processing_class=load_tiny_tokenizer(), args=args,
        train_dataset=Dataset.from_dict({"prompt": ["a", "b"]}),
        reward_funcs=lambda completions, **kw: [0.0] * len(completions))
    pad = trainer.processing_class.pad_token_id
    prompts, completions = [row(30, 1), row(22, 2)], [row(12, 3), row(16, 4)]
    width = max(map(len, prompts))
    input_ids = torch.tensor([[pad] * (width - len(p)) + p + c + [pad] * (16 - len(c))
                              for p, c in zip(prompts, completions, strict=True)])
    attention = torch.tensor([[0] * (width - len(p)) + [1] * (len(p) + len(c)) + [0] * (16 - len(c))
                              for p, c in zip(prompts, completions, strict=True)])
    ours, our_entropy, _ = trainer._get_per_token_logps_and_entropies(
        trainer.model, input_ids, attention, 16, compute_entropy=True)
    theirs, their_entropy, _ = GRPOTrainer._get_per_token_logps_and_entropies(
        trainer, trainer.model, input_ids, attention, 16, compute_entropy=True)
    real = attention[:, -16:].bool()
    assert torch.allclose(ours[real], theirs[real], atol=1e-4)
    assert torch.allclose(our_entropy[real], their_entropy[real], atol=1e-3)
    assert (ours[~real] == 0).all()
    assert trainer.frozen_prefix_stats()["grad_tokens"] == 12 + 16

    # A row out of the loss (no token sampled: a masked group) is not scored at all; the other
    # row's scores are unchanged.
    trainer._sampled_mask = torch.tensor([[0] * 12 + [1] * 4, [1] * 6 + [0] * 4 + [1] * 6])
    masked, _, _ = trainer._get_per_token_logps_and_entropies(
        trainer.model, input_ids, attention, 16, compute_entropy=True)
    sampled = trainer._sampled_mask[1].bool() & real[1]  # only the sampled tokens get logits
    assert (masked[0] == 0).all() and (masked[1][~sampled] == 0).all()
    assert torch.allclose(masked[1][sampled], theirs[1][sampled], atol=1e-4)
    assert trainer.frozen_prefix_stats()["grad_tokens"] == 12 + 16 + 16
    # every row out of the loss: nothing scored, and the loss still backpropagates (zeros)
    trainer._sampled_mask = torch.zeros(2, 16, dtype=torch.long)
    none, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, input_ids, attention, 16)
    (none * 0).sum().backward()
    trainable = [p for p in trainer.model.parameters() if p.requires_grad]
    assert all(p.grad is not None and not p.grad.any() for p in trainable)
    assert trainer.frozen_prefix_stats()["grad_tokens"] == 12 + 16 + 16


def test_one_row_a_pass_updates_the_weights_as_one_pass_over_the_group(tmp_path):
    """The learning curve trains a GRPO step one row a pass (`benchmarks/curve/grpo.py`, for its
    memory): under TRL's default loss the update is that of one pass over the whole group. Plain
    SGD, so the update is the gradient itself (Adam's first step would hide its size)."""
    from datasets import Dataset
    from trl import GRPOConfig

    from harness_gym.training.trainers import FrozenPrefixGRPOTrainer

    prompt = row(30, 1)
    completions = [row(n, 10 + n) for n in (8, 20, 13, 16)]
    env_masks = [[1] * n for n in (8, 20, 13, 16)]
    env_masks[1][5:12] = [0] * 7  # a tool's output inside the second row
    rewards = [1.0, 0.0, 0.5, 0.0]

    def rollout(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        return {"prompt_ids": [prompt] * 4, "completion_ids": completions,
                "logprobs": [[-1.0] * len(c) for c in completions], "env_mask": env_masks}

    updates = []
    for batch, accumulate in ((4, 1), (1, 4)):
        model = tiny_model()
        before = {k: p.detach().clone() for k, p in model.named_parameters()}
        args = GRPOConfig(
            output_dir=str(tmp_path / str(batch)), per_device_train_batch_size=batch,
            gradient_accumulation_steps=accumulate, num_generations=4, max_steps=1,
            max_completion_length=32, optim="sgd", learning_rate=1.0, max_grad_norm=0.0,
            beta=0.0, report_to="none", use_cpu=True, bf16=False, save_strategy="no", seed=0,
            activation_checkpointing=False)
        trainer = FrozenPrefixGRPOTrainer(
            model=model, processing_class=load_tiny_tokenizer(), args=args,
            train_dataset=Dataset.from_dict({"prompt": ["a"]}), rollout_func=rollout,
            reward_funcs=lambda completions, **kw: rewards[:len(completions)])
        trainer.train()
        updates.append({k: p.detach() - before[k] for k, p in model.named_parameters()})
    assert max(float(u.abs().max()) for u in updates[0].values()) > 1e-4  # a real step
    for name, update in updates[0].items():
        assert torch.allclose(updates[1][name], update, rtol=1e-4, atol=1e-7), name


def test_the_grpo_step_memory_benchmarks_quick_mode_measures_each_way_at_one_loss(tmp_path):
    """`benchmarks/grpo_step_memory.py --quick`: the tiny model on made-up rows, each way of
    training a group in a process of its own; the same loss each way, and the way the trainer
    takes now peaks lower than scoring every position in one pass."""
    import json
    import math
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "benchmarks" / "grpo_step_memory.py"
    out = tmp_path / "memory.json"
    done = subprocess.run([sys.executable, str(script), "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    ways = results["variants"]
    assert list(ways) == ["every_position_one_pass", "sampled_one_pass",
                          "sampled_recomputed_row_by_row"]
    losses = [w["loss"] for w in ways.values()]
    assert all(math.isfinite(x) and math.isclose(x, losses[0], rel_tol=1e-4) for x in losses)
    assert all(w["peak_rss_gib"] > w["model_loaded_rss_gib"] > 0 for w in ways.values())
    before, now = (ways[k]["peak_rss_gib"] for k in ("every_position_one_pass",
                                                     "sampled_recomputed_row_by_row"))
    assert results["peak_ratio_now_vs_before"] == round(now / before, 3) < 1
