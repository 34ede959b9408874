"""LoRA for SFT and GRPO, with engines that always get merged full weights.

Why: a full-weight checkpoint of SmolLM2-135M is 540 MB (and its optimizer state twice that), so
a run's checkpoints cannot travel in git from one machine to the next; a rank-8 adapter on the
attention's query and value projections is ~1.8 MB. The engines that serve the policy (vLLM's
`reload_weights`, a `TransformersEngine`) know nothing of adapters: they load the base model's
parameter names and shapes. So every path from a LoRA model to an engine goes through
`merged_named_parameters` (each GRPO step's weight sync) or `materialise` (a checkpoint's
adapter, merged into a safetensors directory on local disk, for an evaluation).

    >>> from transformers import AutoModelForCausalLM
    >>> from harness_gym.engines.tiny import tiny_model_dir
    >>> base = AutoModelForCausalLM.from_pretrained(tiny_model_dir())
    >>> names = [name for name, _ in base.named_parameters()]
    >>> model = with_lora(base, LoraSpec(rank=4))
    >>> [name for name, _ in merged_named_parameters(model)] == names
    True
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

__all__ = ["LoraSpec", "UnsupportedAdapterError", "is_adapter_dir", "load_adapter",
           "materialise", "merged_named_parameters", "with_lora"]

ADAPTER_CONFIG = "adapter_config.json"  # what `save_pretrained` of a peft model writes
ADAPTER_WEIGHTS = "adapter_model.safetensors"
MERGED_FROM = "merged_from.sha256"  # a materialised directory: the adapter it merged


class UnsupportedAdapterError(ValueError):
    """A peft model whose merge this module does not do (DoRA, LoRA biases, embedding LoRA,
    `modules_to_save`): merge it with `merge_and_unload()` and train the result instead."""


@dataclass(frozen=True)
class LoraSpec:
    """A LoRA adapter: `rank`, `alpha` (the update is scaled by alpha / rank; None: 2 x rank)
    and the linear layers it wraps (module names as in the model, e.g. Qwen2's and Llama's
    `q_proj`, `v_proj`: peft's own default for both)."""

    rank: int
    alpha: float | None = None
    targets: tuple[str, ...] = ("q_proj", "v_proj")

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValueError(f"a LoRA rank is at least 1, got {self.rank}")
        if not self.targets:
            raise ValueError("LoRA wraps at least one module: give targets")

    def peft_config(self) -> Any:
        from peft import LoraConfig

        return LoraConfig(r=self.rank, lora_alpha=self.alpha or 2 * self.rank,
                          target_modules=list(self.targets), lora_dropout=0.0, bias="none",
                          task_type="CAUSAL_LM")


def with_lora(model: Any, spec: LoraSpec) -> Any:
    """`model` with a fresh, trainable adapter (peft's `get_peft_model`: B starts at zero, so the
    wrapped model computes exactly what `model` did); only the adapter requires grad."""
    from peft import get_peft_model

    return get_peft_model(model, spec.peft_config())


def load_adapter(base: Any, adapter_dir: str | Path, *, trainable: bool = True) -> Any:
    """`base` (a model) with the adapter saved in `adapter_dir`, to train on from there."""
    from peft import PeftModel

    return PeftModel.from_pretrained(base, str(adapter_dir), is_trainable=trainable)


def is_adapter_dir(path: str | Path) -> bool:
    return (Path(path) / ADAPTER_CONFIG).is_file()


def merged_named_parameters(model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """`model`'s parameters as the base model names them, each LoRA-wrapped linear layer's
    weight merged (W + alpha/rank * B @ A, the value `merge_and_unload()` leaves), the adapter's
    own tensors left out: what an engine that loads the base model's checkpoint can take.
    `model` is a peft model or its inner model; a model without LoRA layers yields its
    `named_parameters()`. Nothing is modified in place; tensors are detached."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    renamed = _lora_renames(inner)
    for name, param in inner.named_parameters():
        if name not in renamed:
            yield name, param.detach()
            continue
        new_name, layer = renamed[name]
        if new_name is None:
            continue  # lora_A / lora_B: merged into their layer's weight
        value = param.detach()
        if layer is not None:
            value = value + _delta(layer)
        yield new_name, value


def _lora_renames(inner: Any) -> dict[str, tuple[str | None, Any]]:
    """For each parameter inside a LoRA layer: its base-model name (None: an adapter tensor)
    and, for the wrapped weight, the layer whose update it takes."""
    try:
        from peft.tuners.lora import LoraLayer
        from peft.utils.other import ModulesToSaveWrapper
    except ImportError:
        return {}
    renames: dict[str, tuple[str | None, Any]] = {}
    for owner, module in inner.named_modules():
        if isinstance(module, ModulesToSaveWrapper):
            raise UnsupportedAdapterError(f"{owner}: modules_to_save is not merged here")
        if not isinstance(module, LoraLayer):
            continue
        adapters = [a for a in module.active_adapters if a in module.lora_A]
        if (module.lora_embedding_A or getattr(module, "lora_variant", None)
                or any(getattr(module, "lora_bias", {}).get(a) for a in adapters)):
            raise UnsupportedAdapterError(f"{owner}: only plain LoRA on linear layers merges here")
        for sub, _ in module.named_parameters():
            leaf = sub.removeprefix("base_layer.")
            merged = leaf == "weight" and not module.merged and adapters
            renames[f"{owner}.{sub}"] = ((f"{owner}.{leaf}", module if merged else None)
                                         if sub.startswith("base_layer.") else (None, None))
    return renames


def _delta(layer: Any) -> torch.Tensor:
    """The layer's update, summed over its active adapters: scaling * B @ A."""
    total = None
    for adapter in layer.active_adapters:
        if adapter not in layer.lora_A:
            continue
        a, b = layer.lora_A[adapter].weight.detach(), layer.lora_B[adapter].weight.detach()
        delta = (b @ a) * layer.scaling[adapter]
        delta = delta.T if layer.fan_in_fan_out else delta
        total = delta if total is None else total + delta
    assert total is not None  # _lora_renames merges only layers with an active adapter
    return total


def materialise(adapter_dir: str | Path, base_dir: str | Path, out_dir: str | Path) -> Path:
    """The full weights of `adapter_dir` on the base model in `base_dir`: a model directory
    (config, `model.safetensors`, the base's tokenizer) at `out_dir`, whole or absent. One made
    earlier from the same adapter (its weights' hash, kept beside) is taken as it is."""
    import hashlib

    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(out_dir)
    digest = hashlib.sha256((Path(adapter_dir) / ADAPTER_WEIGHTS).read_bytes()).hexdigest()
    if (out / "model.safetensors").exists() and (out / MERGED_FROM).is_file() \
            and (out / MERGED_FROM).read_text() == digest:
        return out
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype="float32")
    merged = load_adapter(base, adapter_dir, trainable=False).merge_and_unload()
    merged.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(base_dir).save_pretrained(tmp)
    (tmp / MERGED_FROM).write_text(digest)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out
