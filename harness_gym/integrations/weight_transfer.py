"""The trainer's weights into the engine that serves the episodes: TRL 1.16's
`WeightTransferProtocol` (`init_weight_transfer`, `pause`, `send_weights`, `resume`, `destroy`)
for harness-gym's engines.

An asynchronous trainer syncs as `AsyncGRPOTrainer._sync_weight_merged` does
(`trl/experimental/async_grpo/async_grpo_trainer.py`): `pause()`, `send_weights(named tensors)`,
`resume()`, then it bumps its `model_version` and tells the rollout worker. The protocol passes
no version, so each transfer counts its syncs (`version`, from `start_version`) in step with the
trainer's counter, and labels the engine's weights with it before `resume()`: calls admitted
afterwards record the new version, calls that ran before it the old one.

- `EngineWeightTransfer` (CPU): an in-process `TransformersEngine` holding its own copy of the
  policy takes the tensors between calls, never mid-generation (`engines/weight_updates.py`).
- `VLLMWeightTransfer` (GPU): TRL's own NCCL `WeightTransferClient` moves the tensors into the
  `vllm:` engine's server; this adds the label vLLM needs (TRL's `/finish_weight_update` sends
  none; docs/design.md, "vLLM 0.33 as read"). Not runnable here: tests/test_weight_transfer.py drives
  it at the wire against `tests/support/vllm_wire_server.py`, without the tensors.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any, Protocol

import torch

from ..engines.transformers_engine import TransformersEngine, default_stop_token_ids

__all__ = ["EngineWeightTransfer", "VLLMWeightTransfer", "WeightTransfer"]


class WeightTransfer(Protocol):
    """TRL's `WeightTransferProtocol`, restated so this module imports without TRL."""

    def init_weight_transfer(self) -> None: ...
    def pause(self) -> None: ...
    def send_weights(self, iterator: Iterator[tuple[str, torch.Tensor]]) -> None: ...
    def resume(self) -> None: ...
    def destroy(self) -> None: ...


class EngineWeightTransfer:
    """Weights into an in-process `TransformersEngine`; `pause` waits (up to
    `drain_timeout_s`) for its running generations to end.

        >>> from harness_gym.engines import load_engine
        >>> engine = load_engine("tiny")
        >>> transfer = EngineWeightTransfer(engine)
        >>> transfer.pause()
        >>> transfer.send_weights(iter(engine.model.named_parameters()))
        >>> transfer.resume()
        >>> transfer.version, engine.weights_version, engine.policy_version
        (1, 1, 1)
        >>> engine.close()
    """

    def __init__(
        self, engine: TransformersEngine, *, start_version: int = 0,
        drain_timeout_s: float | None = 600.0,
    ) -> None:
        self.engine = engine
        self.version = int(start_version)
        self.drain_timeout_s = drain_timeout_s
        self.tensors_sent = 0

    @classmethod
    def serving_copy(cls, model: Any, tokenizer: Any, **engine_kwargs: Any) -> EngineWeightTransfer:
        """A transfer into a new engine around a private copy of `model`: the optimiser
        updates the trainer's tensors in place, and a generation must never see that."""
        served = copy.deepcopy(model).eval()
        engine_kwargs.setdefault("stop_token_ids", default_stop_token_ids(model, tokenizer))
        return cls(TransformersEngine(served, tokenizer, **engine_kwargs))

    def init_weight_transfer(self) -> None:
        """Nothing to set up: the engine is in this process."""

    def pause(self) -> None:
        self.engine.pause(self.drain_timeout_s)

    def send_weights(self, iterator: Iterator[tuple[str, torch.Tensor]]) -> None:
        self.tensors_sent += self.engine.load_weights(iterator, self.version + 1)
        self.version += 1

    def resume(self) -> None:
        self.engine.resume()

    def destroy(self) -> None:
        self.engine.resume()  # never leave the engine holding calls back


class VLLMWeightTransfer:
    """TRL's weight transfer into a `VLLMEngine`'s server, then the version label on every
    server (`VLLMEngine.set_weight_version`, `POST /update_weight_version`) before `resume()`.

    `transfer` moves the tensors: `VLLMWeightTransfer.nccl(engine, model)` builds TRL's
    `WeightTransferClient` (NCCL; needs vLLM installed and a server started by `trl vllm-serve`,
    i.e. dev mode with `--weight-transfer-config '{"backend":"nccl"}'`). TRL's client talks to one
    server, so `nccl` wants an engine with one URL.
    """

    def __init__(self, engine: Any, transfer: WeightTransfer, *, start_version: int = 0) -> None:
        self.engine = engine
        self.transfer = transfer
        self.version = int(start_version)

    @classmethod
    def nccl(
        cls, engine: Any, model: Any, *, weight_sync_timeout: int = 1800
    ) -> VLLMWeightTransfer:
        from trl.experimental.async_grpo.async_grpo_trainer import _iter_vllm_named_params
        from trl.experimental.async_grpo.vllm_client import VLLMClient
        from trl.experimental.async_grpo.weight_transfer import WeightTransferClient

        if len(engine.urls) != 1:
            raise ValueError(f"TRL's weight transfer feeds one vLLM server; the engine has "
                             f"{len(engine.urls)}: {', '.join(engine.urls)}")
        # The manifest walks the same generator as the trainer's weight stream (TRL's own), so
        # the server sizes its receive buffers for exactly what is sent.
        params = list(_iter_vllm_named_params(model))
        manifest = {"names": [name for name, _ in params],
                    "dtype_names": [str(p.dtype).split(".")[-1] for _, p in params],
                    "shapes": [list(p.shape) for _, p in params]}
        client = WeightTransferClient(VLLMClient(engine.urls[0]), manifest,
                                      weight_sync_timeout=weight_sync_timeout)
        return cls(engine, client)

    def init_weight_transfer(self) -> None:
        self.transfer.init_weight_transfer()

    def pause(self) -> None:
        self.transfer.pause()

    def send_weights(self, iterator: Iterator[tuple[str, torch.Tensor]]) -> None:
        self.transfer.send_weights(iterator)
        self.version += 1
        # While still paused: tokens sampled after `resume()` carry the new label.
        self.engine.set_weight_version(self.version)

    def resume(self) -> None:
        self.transfer.resume()

    def destroy(self) -> None:
        self.transfer.destroy()
