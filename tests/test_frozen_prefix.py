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
    assert (masked[0] == 0).all() and torch.allclose(masked[1][real[1]], theirs[1][real[1]],
                                                     atol=1e-4)
    assert trainer.frozen_prefix_stats()["grad_tokens"] == 12 + 16 + 16
    # every row out of the loss: nothing scored, and the loss still backpropagates (zeros)
    trainer._sampled_mask = torch.zeros(2, 16, dtype=torch.long)
    none, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, input_ids, attention, 16)
    (none * 0).sum().backward()
    trainable = [p for p in trainer.model.parameters() if p.requires_grad]
    assert all(p.grad is not None and not p.grad.any() for p in trainable)
    assert trainer.frozen_prefix_stats()["grad_tokens"] == 12 + 16 + 16
