"""The transformers engine reuses the keys and values of prompt prefixes it already computed:
the next call of a conversation runs only its new tokens, conversations share their common
start, and the logprobs stay those of an uncached run (to float rounding). Weights that change
retire every cached prefix. Then through the real Pi CLI."""

from __future__ import annotations

import asyncio
import shutil

import gymnasium as gym
import pytest
import torch
from transformers import AutoModelForCausalLM

import harness_gym  # noqa: F401  (registers HarnessSWE-v0)
from harness_gym.engines import SamplingParams, TransformersEngine, load_tiny_tokenizer
from harness_gym.engines.prefix_cache import PrefixKVCache
from harness_gym.engines.tiny import tiny_model_dir
from harness_gym.engines.transformers_engine import default_stop_token_ids
from harness_gym.tasks import load_tasks

TOLERANCE = 1e-5  # float32 rounding: the same sums, split into two forwards


def make_engine(**kwargs) -> TransformersEngine:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir(), dtype=torch.float32)
    tokenizer = load_tiny_tokenizer()
    return TransformersEngine(model, tokenizer, model_name="tiny",
                              stop_token_ids=default_stop_token_ids(model, tokenizer), **kwargs)


@pytest.fixture
def engine() -> TransformersEngine:
    engine = make_engine()
    yield engine
    engine.close()


def chat(engine: TransformersEngine, *turns: str) -> list[int]:
    messages = [{"role": "system", "content": "You are a careful coding agent. " * 20}]
    messages += [{"role": "user" if i % 2 == 0 else "assistant", "content": text}
                 for i, text in enumerate(turns)]
    return engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                return_dict=False)


def generate(engine: TransformersEngine, prompt: list[int], **sampling):
    return asyncio.run(engine.generate(prompt, SamplingParams(**sampling)))


def test_the_next_call_of_a_conversation_runs_only_its_new_tokens(engine):
    first = chat(engine, "Fix the bug in calc.py.")
    done = generate(engine, first, max_tokens=12, seed=0)
    tool_result = engine.tokenizer.encode("<|im_start|>user\n<tool_response>\nok\n</tool_response>")
    second = first + done.token_ids + tool_result
    before = engine.prefix_cache_stats
    generate(engine, second, max_tokens=4, seed=1)
    after = engine.prefix_cache_stats
    # Everything the first call ran is reused: its prompt and all its tokens but the last
    # sampled one (which was never fed back).
    assert after["reused_tokens"] - before["reused_tokens"] == len(first) + 12 - 1
    assert after["computed_tokens"] - before["computed_tokens"] == len(tool_result) + 1


def test_different_conversations_share_their_common_start(engine):
    a, b = chat(engine, "Fix calc.py."), chat(engine, "Fix the README typo.")
    common = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    generate(engine, a, max_tokens=2, seed=0)
    before = engine.prefix_cache_stats["reused_tokens"]
    generate(engine, b, max_tokens=2, seed=0)
    assert engine.prefix_cache_stats["reused_tokens"] - before == common > 50


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 1.0, "seed": 5}])
def test_logprobs_with_a_cached_prefix_equal_an_uncached_run(engine, sampling):
    uncached = TransformersEngine(engine.model, engine.tokenizer, model_name="tiny",
                                  stop_token_ids=engine.stop_token_ids, prefix_cache_bytes=0)
    try:
        first = chat(engine, "Fix the bug in calc.py.")
        done = generate(engine, first, max_tokens=16, seed=0)
        second = first + done.token_ids + chat(engine, "x", "y", "next")[-12:]
        cached = generate(engine, second, max_tokens=24, **sampling)
        assert engine.prefix_cache_stats["hits"] >= 1
        plain = generate(uncached, second, max_tokens=24, **sampling)
        assert uncached.prefix_cache_stats["hits"] == 0
    finally:
        uncached.close()
    assert cached.token_ids == plain.token_ids
    assert max(abs(a - b) for a, b in zip(cached.logprobs, plain.logprobs)) < TOLERANCE
    if sampling["temperature"] == 0:  # raw logprobs: a one-forward teacher-forced rescore
        rescored = engine.score(second, cached.token_ids)
        assert max(abs(a - b) for a, b in zip(cached.logprobs, rescored)) < TOLERANCE


OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.5),
    # transformers 5's default: it writes the weights without bumping their version counters
    "fused-adamw": lambda params: torch.optim.AdamW(params, lr=0.5, fused=True),
    "foreach-adamw": lambda params: torch.optim.AdamW(params, lr=0.5, foreach=True),
}


@pytest.mark.parametrize("make_optimizer", OPTIMIZERS.values(), ids=OPTIMIZERS)
def test_a_weight_update_retires_every_cached_prefix(engine, make_optimizer):
    prompt = chat(engine, "Fix the bug in calc.py.")
    generate(engine, prompt, max_tokens=8, seed=0)
    # An optimizer step, as a trainer sharing the engine's model takes between rollouts.
    optimizer = make_optimizer(engine.model.parameters())
    logits = engine.model(input_ids=torch.tensor([prompt])).logits
    logits[0, -1, 0].backward()
    optimizer.step()
    hits = engine.prefix_cache_stats["hits"]
    after = generate(engine, prompt, max_tokens=8, temperature=0)
    assert engine.prefix_cache_stats["hits"] == hits  # nothing computed before the step reused
    rescored = engine.score(prompt, after.token_ids)
    assert max(abs(a - b) for a, b in zip(after.logprobs, rescored)) < TOLERANCE


def run_prefix(model, cache: PrefixKVCache, ids: list[int]) -> int:
    kv, start = cache.restore(ids)
    with torch.inference_mode():
        model(input_ids=torch.tensor([ids[start:]]), cache=kv)
    cache.add(ids, kv)
    return start


def test_the_byte_budget_evicts_the_least_recently_used_prefix(engine):
    model = engine.model
    probe = PrefixKVCache(model)
    run_prefix(model, probe, list(range(100)))
    cache = PrefixKVCache(model, max_bytes=int(2.5 * probe.nbytes))
    a, b, c = ([base + i for i in range(100)] for base in (1000, 2000, 3000))
    for ids in (a, b):
        run_prefix(model, cache, ids)
    assert run_prefix(model, cache, a + [5]) == 100  # a is used again: b is now the oldest
    run_prefix(model, cache, c)
    assert len(cache) == 2 and cache.nbytes <= cache.max_bytes
    assert cache.restore(b + [5])[1] == 0  # evicted
    assert cache.restore(a + [7])[1] == 100  # a + [5] replaced a, its prefix, and covers it


def test_kv_computed_under_other_weights_is_not_kept(engine):
    cache = PrefixKVCache(engine.model)
    ids = list(range(1, 60))
    kv, _ = cache.restore(ids)
    with torch.inference_mode():
        engine.model(input_ids=torch.tensor([ids]), cache=kv)
    cache.add(ids, kv, fingerprint=cache.fingerprint() - 1)
    assert len(cache) == 0


def test_pi_episodes_reuse_their_shared_system_prompt_and_stay_token_faithful():
    if shutil.which("npm") is None:
        pytest.skip("Pi installs with npm")
    engine = make_engine()
    tasks = load_tasks("family:train")[:2]
    env = gym.make("HarnessSWE-v0", harness="pi", tasks=tasks, engine=engine,
                   sampling={"max_tokens": 16, "temperature": 0}, episode_timeout_s=300,
                   progress=False)
    try:
        traces = []
        for task in tasks:
            env.reset(options={"task_id": task.instance_id})
            _, _, _, _, info = env.step(None)
            traces.append(info["trace"])
        stats = engine.prefix_cache_stats
        first_prompts = [trace[0]["prompt_ids"] for trace in traces]
        common = next(i for i, (x, y) in enumerate(zip(*first_prompts, strict=False)) if x != y)
        assert common > 300  # Pi's system prompt, up to the episode's work dir
        assert stats["hits"] >= 1 and stats["reused_tokens"] >= common
        for trace in traces:  # invariant 1 holds with the cache on
            for segment in trace:
                start = len(segment["prompt_ids"])
                ids = segment["prompt_ids"] + segment["response_ids"]
                sampled = [i for i, bit in enumerate(segment["loss_mask"]) if bit]
                rescored = engine.score(ids[:start], segment["response_ids"])
                for i in sampled:
                    assert abs(rescored[i] - segment["response_logprobs"][i]) < 1e-4
    finally:
        env.close()
        engine.close()
