"""A LoRA model's weights as the base model names them, merged: what an engine can take.

Why here, beside `weight_updates`: the engines that serve a policy (vLLM's `reload_weights`, a
`TransformersEngine`'s `load_weights`) load the base model's parameter names and shapes and know
nothing of adapters, so a trainer's LoRA model reaches them only through this merge (each GRPO
step's weight sync; `harness_gym.training.lora` trains and saves the adapters). peft is imported
only when a model has LoRA layers to find.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["UnsupportedAdapterError", "merged_named_parameters"]


class UnsupportedAdapterError(ValueError):
    """A peft model whose merge this module does not do (DoRA, LoRA biases, embedding LoRA,
    `modules_to_save`): merge it with `merge_and_unload()` and train the result instead."""


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
