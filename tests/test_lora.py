"""LoRA (harness_gym.training.lora): the weights an engine gets from a LoRA model are
W + alpha/r * B @ A (peft's own merge) under the base model's names; an engine synced with them,
or loading the materialised adapter, scores as the LoRA model; SFT with `lora` trains the adapter
only and makes the demonstration likelier; the frozen-prefix scorer sees the adapter."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("peft")

from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from harness_gym.engines.tiny import tiny_model_dir  # noqa: E402
from harness_gym.training.lora import (  # noqa: E402
    LoraSpec,
    UnsupportedAdapterError,
    is_adapter_dir,
    load_adapter,
    materialise,
    merged_named_parameters,
    with_lora,
)

SPEC = LoraSpec(rank=4, alpha=8, targets=("q_proj", "v_proj", "down_proj"))


def base_model():
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir(), dtype="float32")


def trained_lora(spec: LoraSpec = SPEC, seed: int = 0):
    """A LoRA model whose adapter is not the zero update peft starts from (B = 0 would make
    any merge, right or wrong, equal the base weights)."""
    model = with_lora(base_model(), spec)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
    return model


def test_merged_parameters_equal_merge_and_unload_under_the_base_models_names():
    names = [name for name, _ in base_model().named_parameters()]
    model = trained_lora()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    merged = list(merged_named_parameters(model))
    reference = list(copy.deepcopy(model).merge_and_unload().named_parameters())
    assert [n for n, _ in merged] == names == [n for n, _ in reference]
    for (name, tensor), (_, expected) in zip(merged, reference, strict=True):
        assert torch.equal(tensor, expected), name
        assert not tensor.requires_grad
    base = dict(base_model().named_parameters())
    changed = {n for n, t in merged if not torch.equal(t, base[n])}
    assert changed == {n for n in names if n.endswith(("q_proj.weight", "v_proj.weight",
                                                       "down_proj.weight"))}
    # nothing merged in place: the LoRA model computes as before
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_each_merged_weight_is_the_base_weight_plus_alpha_over_rank_times_b_at_a():
    """The arithmetic itself, from the adapter's tensors (not peft's merge, which the test
    above compares with): W' = W + (alpha / r) * B @ A on each wrapped layer, W elsewhere."""
    model = trained_lora()
    merged = dict(merged_named_parameters(model))
    base = dict(base_model().named_parameters())
    adapter = {n: p.detach() for n, p in model.named_parameters() if "lora_" in n}
    scale = SPEC.alpha / SPEC.rank
    wrapped = 0
    for name, weight in base.items():
        prefix = "base_model.model." + name.removesuffix(".weight")
        a = adapter.get(f"{prefix}.lora_A.default.weight")
        if a is None:
            assert torch.equal(merged[name], weight), name
            continue
        b = adapter[f"{prefix}.lora_B.default.weight"]
        assert a.shape[0] == b.shape[1] == SPEC.rank
        expected = weight.detach() + scale * (b @ a)
        assert torch.allclose(merged[name], expected, rtol=0, atol=1e-6), name
        assert not torch.allclose(merged[name], weight, atol=1e-4), name  # it moved
        wrapped += 1
    assert wrapped == 3 * base_model().config.num_hidden_layers  # q, v, down in every layer


def test_the_model_inside_a_peft_model_merges_alike_and_a_plain_model_passes_through():
    model = trained_lora()
    outer = dict(merged_named_parameters(model))
    inner = dict(merged_named_parameters(model.get_base_model()))
    assert outer.keys() == inner.keys() and all(torch.equal(outer[k], inner[k]) for k in outer)
    plain = base_model()
    assert [(n, p.data_ptr()) for n, p in merged_named_parameters(plain)] == \
        [(n, p.data_ptr()) for n, p in plain.named_parameters()]


def test_merged_weights_load_strictly_into_the_base_model_and_compute_what_lora_does():
    model = trained_lora().eval()
    target = base_model().eval()
    missing, unexpected = target.load_state_dict(dict(merged_named_parameters(model)),
                                                 strict=False)
    assert unexpected == [] and set(missing) <= {"lm_head.weight"}  # tied to the embedding
    ids = torch.tensor([list(range(100, 140))])
    with torch.no_grad():
        lora_logits, merged_logits = model(input_ids=ids).logits, target(input_ids=ids).logits
        base_logits = base_model()(input_ids=ids).logits
    assert torch.allclose(lora_logits, merged_logits, atol=1e-5)
    assert not torch.allclose(lora_logits, base_logits, atol=1e-3)  # the adapter matters


def test_an_already_merged_adapter_is_not_added_twice():
    model = trained_lora()
    expected = dict(merged_named_parameters(model))
    model.merge_adapter()  # peft merges into base_layer.weight and marks the layers merged
    again = dict(merged_named_parameters(model))
    assert all(torch.allclose(again[k], expected[k], atol=1e-6) for k in expected)


@pytest.mark.parametrize("extra", [{"use_dora": True}, {"modules_to_save": ["lm_head"]}])
def test_adapters_this_merge_does_not_cover_are_refused(extra):
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"], **extra)
    model = get_peft_model(base_model(), config)
    with pytest.raises(UnsupportedAdapterError):
        list(merged_named_parameters(model))


def test_a_saved_adapter_materialises_as_a_model_directory_of_its_merged_weights(tmp_path):
    from safetensors.torch import load_file

    model = trained_lora()
    model.save_pretrained(tmp_path / "adapter")
    assert is_adapter_dir(tmp_path / "adapter") and not is_adapter_dir(tiny_model_dir())
    out = materialise(tmp_path / "adapter", tiny_model_dir(), tmp_path / "merged")
    saved = load_file(out / "model.safetensors")
    for name, tensor in merged_named_parameters(model):
        assert torch.equal(saved[name], tensor), name
    assert AutoTokenizer.from_pretrained(out)("def f(): pass")["input_ids"]
    # another adapter at the same path: made again, not the stale merge
    trained_lora(seed=1).save_pretrained(tmp_path / "adapter")
    again = load_file(materialise(tmp_path / "adapter", tiny_model_dir(),
                                  tmp_path / "merged") / "model.safetensors")
    assert not torch.equal(again["model.layers.0.self_attn.q_proj.weight"],
                           saved["model.layers.0.self_attn.q_proj.weight"])


def completion_logprobs(model, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """Teacher-forced logprobs of `completion` after `prompt` under `model` (T=1)."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model.eval()(input_ids=ids).logits[0, len(prompt) - 1:-1].float()
    return logits.log_softmax(-1).gather(1, torch.tensor(completion)[:, None])[:, 0]


def test_weights_synced_into_an_engine_score_as_the_materialised_and_the_lora_model(tmp_path):
    """The two ways a LoRA policy reaches an engine: its merged weights pushed into a running
    base-model engine (each GRPO step's sync), and the adapter materialised into a model
    directory an engine loads (an evaluation). Both score a completion as the LoRA model does."""
    from harness_gym.engines.transformers_engine import TransformersEngine
    from harness_gym.integrations.weight_transfer import EngineWeightTransfer

    model = trained_lora()
    model.save_pretrained(tmp_path / "adapter")
    out = materialise(tmp_path / "adapter", tiny_model_dir(), tmp_path / "merged")
    prompt, completion = list(range(200, 230)), list(range(300, 316))
    expected = completion_logprobs(model, prompt, completion)
    synced = TransformersEngine.from_pretrained(tiny_model_dir())
    loaded = TransformersEngine.from_pretrained(out)
    try:
        before = torch.tensor(synced.score(prompt, completion))
        assert not torch.allclose(before, expected, atol=1e-3)  # the base model scores apart
        transfer = EngineWeightTransfer(synced)
        transfer.pause()
        transfer.send_weights(merged_named_parameters(model))
        transfer.resume()
        assert synced.weights_version == 1
        for engine in (synced, loaded):
            got = torch.tensor(engine.score(prompt, completion))
            assert torch.allclose(got, expected, atol=1e-4), (engine.model_name, got - expected)
    finally:
        synced.close()
        loaded.close()


def test_a_loaded_adapter_trains_on_from_where_it_was_saved(tmp_path):
    model = trained_lora()
    model.save_pretrained(tmp_path / "adapter")
    loaded = load_adapter(base_model(), tmp_path / "adapter", trainable=True)
    trainable = {n for n, p in loaded.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    mine, theirs = dict(merged_named_parameters(model)), dict(merged_named_parameters(loaded))
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)


def demo_rows(tokenizer) -> list[dict[str, list[int]]]:
    """A demonstration as SFT takes it: the prompt masked out, the agent's answer the loss."""
    prompt = tokenizer("Fix the bug in add():\n")["input_ids"]
    answer = tokenizer("def add(a, b):\n    return a + b\n")["input_ids"]
    return [{"input_ids": prompt + answer, "labels": [-100] * len(prompt) + answer}] * 2


def test_sft_with_lora_raises_the_demos_logprobs_training_only_the_adapter(tmp_path):
    from harness_gym.training.sft import masked_nll, sft_trainer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir())
    base = base_model()
    frozen = {n: p.detach().clone() for n, p in base.named_parameters()}
    rows = demo_rows(tokenizer)
    nll_before = masked_nll(base_model(), rows)
    trainer = sft_trainer(base, tokenizer, rows, output_dir=tmp_path / "run",
                          frozen_prefix=True, lora=LoraSpec(rank=2), max_steps=2,
                          learning_rate=1e-2, save_strategy="steps", save_steps=2)
    trainer.train()
    # the policy the engines get (merged weights in the base model) is likelier to write the
    # demonstration than before
    policy = base_model()
    policy.load_state_dict(dict(merged_named_parameters(trainer.model)), strict=False)
    nll_after = masked_nll(policy, rows)
    assert nll_after < nll_before - 0.05, (nll_before, nll_after)
    assert masked_nll(trainer.model, rows) == pytest.approx(nll_after, abs=1e-4)
    inner = trainer.model.get_base_model()
    for name, param in inner.named_parameters():  # and only the adapter trained
        if "lora_" not in name:
            assert torch.equal(param, frozen[name.replace(".base_layer", "")]), name
    # the frozen-prefix scorer runs the model inside the peft model (KV cache and LoRA layers)
    assert trainer._scorer(trainer.model).model is inner
    checkpoint = tmp_path / "run" / "checkpoint-2"
    assert is_adapter_dir(checkpoint) and not (checkpoint / "model.safetensors").exists()
    state = torch.load(checkpoint / "optimizer.pt", weights_only=True)["state"]
    adapter_numel = sum(p.numel() for n, p in trainer.model.named_parameters() if p.requires_grad)
    assert sum(s["exp_avg"].numel() for s in state.values()) == adapter_numel


def test_a_lora_spec_is_validated():
    with pytest.raises(ValueError, match="rank"):
        LoraSpec(rank=0)
    with pytest.raises(ValueError, match="targets"):
        LoraSpec(rank=2, targets=())
    assert LoraSpec(rank=8).peft_config().lora_alpha == 16
