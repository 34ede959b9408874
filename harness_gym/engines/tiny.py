"""The `tiny` engine: a 2-layer random-weight Qwen2 with a tokenizer trained on this machine.

It exists so tests and demos run the whole pipeline (real tokenizer, real chat template, real
sampling and logprobs) in seconds on a CPU with no model download. Nothing is shipped: at first
use a byte-level BPE is trained on the Python stdlib's own source (~2 s) and the weights are drawn
from a fixed seed, then both are cached under `$HARNESS_GYM_CACHE/tiny-v1/`. The stdlib differs
between Python versions, so token ids are stable per interpreter, not across them.

The tokenizer copies Qwen2's pipeline (NFC normalizer, Qwen2's split regex, then byte-level with
`use_regex=False`) so it behaves like a real Qwen tokenizer on code, unicode and newlines, and so
`AutoTokenizer.from_pretrained` reloads it to identical ids. The context is 131,072 tokens:
Claude Code's first request alone is ~78 KB (~25k tokens), and with SDPA's causal kernel the
prefill stays bounded in memory (25k tokens: ~2.6 s and ~+170 MB on one core; 60k: ~+360 MB).
"""

from __future__ import annotations

import json
import platform
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ._cache import CACHE_NAMES, build_once
from .chat_templates import QWEN_TOOL_TEMPLATE
from .transformers_engine import TransformersEngine

CACHE_NAME = CACHE_NAMES["tiny"]  # bump it in _cache.py when the recipe changes
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
VOCAB_SIZE = 8192
MAX_CONTEXT = 131_072
WEIGHT_SEED = 0
# ~2 s of BPE training on 2 idle cores, reading included; enough text for an 8k code vocabulary.
TRAINING_CHARS = 8_000_000
# Folders whose contents are not the stdlib proper (and differ between installs).
_SKIPPED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test"})
# Qwen2's pre-tokenizer split (transformers/models/qwen2/tokenization_qwen2.py).
QWEN2_SPLIT_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def load_tiny_engine(arg: str = "") -> TransformersEngine:
    """Entry point for the `tiny` spec (building the model on first use)."""
    if arg:
        raise ValueError(f"the tiny engine takes no argument, got 'tiny:{arg}'")
    return TransformersEngine.from_pretrained(
        tiny_model_dir(), model_name="tiny", tokenizer_source="tiny",
        chat_template=QWEN_TOOL_TEMPLATE
    )


def load_tiny_tokenizer() -> Any:
    """The tiny model's tokenizer (with its chat template), without loading the weights."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir(), local_files_only=True)
    tokenizer.chat_template = QWEN_TOOL_TEMPLATE
    return tokenizer


def tiny_model_dir() -> Path:
    """The cached model directory (tokenizer, config, safetensors), built if missing."""
    return build_once(CACHE_NAME, _build)


def train_tiny_tokenizer() -> Any:
    """Train the tiny BPE and wrap it as a transformers fast tokenizer (in memory)."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token=None, byte_fallback=False, fuse_unk=False))
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=[*SPECIAL_TOKENS, *TOOL_TOKENS],  # ids 0..6, in this order
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodable: no <unk>
        show_progress=False,
    )
    bpe.train_from_iterator(_training_texts(), trainer=trainer)
    # Registered as added tokens so text never splits them. The tool tags are not special, as in
    # Qwen2.5: decoding with skip_special_tokens must keep them.
    bpe.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    bpe.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=MAX_CONTEXT,
        chat_template=QWEN_TOOL_TEMPLATE,
    )


def _training_texts() -> Iterator[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        (p.relative_to(root).as_posix(), p)
        for p in root.rglob("*.py")
        if not _SKIPPED_DIRS.intersection(p.relative_to(root).parts)
    )
    budget = TRAINING_CHARS
    for _, path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        if len(text) > budget:
            return
        budget -= len(text)
        yield text


def init_tiny_model(tokenizer: Any) -> Any:
    """The tiny Qwen2 with its fixed random weights, for `tokenizer` (in memory)."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    eos, im_end = tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"])
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=MAX_CONTEXT,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=im_end,
        pad_token_id=eos,
        dtype="float32",
    )
    with torch.random.fork_rng():  # deterministic weights without touching the caller's RNG
        torch.manual_seed(WEIGHT_SEED)
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=[im_end, eos], pad_token_id=eos)
    return model


def _build(directory: Path) -> None:
    import torch

    started = time.perf_counter()
    tokenizer = train_tiny_tokenizer()
    trained = time.perf_counter()
    tokenizer.save_pretrained(directory)
    init_tiny_model(tokenizer).save_pretrained(directory)
    (directory / "harness_gym_build.json").write_text(
        json.dumps(
            {
                "recipe": CACHE_NAME,
                "python": platform.python_version(),
                "torch": torch.__version__,
                "tokenizer_train_s": round(trained - started, 3),
                "build_s": round(time.perf_counter() - started, 3),
            },
            indent=2,
        )
    )
