"""The local engines against real models: the tiny random Qwen2 (fast) and SmolLM2 (slow)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import unicodedata

import pytest
import torch

from harness_gym.engines import (
    ContextLengthExceeded,
    Engine,
    EngineError,
    SamplingParams,
    TransformersEngine,
    available_engines,
    load_engine,
)
from harness_gym.engines.tiny import (
    init_tiny_model,
    load_tiny_tokenizer,
    tiny_model_dir,
    train_tiny_tokenizer,
)


@pytest.fixture(scope="module")
def tiny() -> TransformersEngine:
    engine = load_engine("tiny")
    assert isinstance(engine, TransformersEngine)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def prompt(tiny: TransformersEngine) -> list[int]:
    return tiny.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Write a function that adds two numbers."}],
        add_generation_prompt=True,
        return_dict=False,
    )


def collect(engine: Engine, prompt_ids: list[int], sampling: SamplingParams) -> list:
    async def run() -> list:
        return [chunk async for chunk in engine.stream(prompt_ids, sampling)]

    return asyncio.run(run())


def generate(engine: Engine, prompt_ids: list[int], sampling: SamplingParams):
    return asyncio.run(engine.generate(prompt_ids, sampling))


def forward_logits(engine: TransformersEngine, ids: list[int]) -> torch.Tensor:
    """Raw float32 logits at every position, computed outside the engine's worker."""
    with torch.inference_mode():
        return engine.model(input_ids=torch.tensor([ids])).logits[0].float()


TRICKY_TEXTS = [
    "naïve café — 日本語のテキスト, emoji 🙂👍🏽, math ∑ x² ≤ ∞",
    unicodedata.normalize("NFD", "Crème brûlée, Ångström, ñ"),
    "def f(x):\n\treturn {'a': [1, 2.5e-3]}  # comment\r\n\n\n    pass\n",
    "I'll say it's DON'T we've 1234567 0x1F\u00a0nbsp\u200bzwsp",
    '<|im_start|>user\nhi<|im_end|>\n<tool_call>\n{"name": "bash"}\n</tool_call><|endoftext|>',
    "   leading and trailing spaces   ",
]


def test_the_tiny_model_is_rebuilt_identically_and_reloads_through_autotokenizer(
    tiny: TransformersEngine, tmp_path
) -> None:
    from transformers import AutoTokenizer

    trained = train_tiny_tokenizer()  # what the cache was saved from, rebuilt in memory
    assert trained.get_vocab() == tiny.tokenizer.get_vocab()
    rebuilt = init_tiny_model(trained).state_dict()
    cached = tiny.model.state_dict()
    assert rebuilt.keys() == cached.keys()
    assert all(torch.equal(rebuilt[name], cached[name]) for name in rebuilt)

    trained.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    for text in TRICKY_TEXTS:
        ids = trained.encode(text, add_special_tokens=False)
        assert reloaded.encode(text, add_special_tokens=False) == ids
        assert tiny.tokenizer.encode(text, add_special_tokens=False) == ids
        assert reloaded.decode(ids) == unicodedata.normalize("NFC", text)
    cached_tokenizer = load_tiny_tokenizer()
    nfd = unicodedata.normalize("NFD", "Crème brûlée")
    assert cached_tokenizer.encode(nfd) == cached_tokenizer.encode(
        unicodedata.normalize("NFC", nfd)
    )
    for tag in ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_response>"):
        assert len(cached_tokenizer.encode(tag, add_special_tokens=False)) == 1
    # Tool tags are not special: a parser reading decoded text must still see them.
    call = cached_tokenizer.encode("<tool_call>x</tool_call><|im_end|>", add_special_tokens=False)
    assert cached_tokenizer.decode(call, skip_special_tokens=True) == "<tool_call>x</tool_call>"


RACING_BUILDER = """
import sys, time
from harness_gym.engines._cache import build_once

def build(directory):
    (directory / "first").write_text(sys.argv[1])
    time.sleep(1.0)  # long enough for the other process to start its own build
    (directory / "second").write_text(sys.argv[1])

print(sorted(p.read_text() + p.name for p in build_once("entry", build).iterdir()))
"""


def test_two_processes_building_one_cache_entry_both_get_the_same_complete_one(tmp_path) -> None:
    env = {**os.environ, "HARNESS_GYM_CACHE": str(tmp_path)}
    builders = [
        subprocess.Popen(
            [sys.executable, "-c", RACING_BUILDER, tag], env=env, stdout=subprocess.PIPE, text=True
        )
        for tag in ("A", "B")
    ]
    outputs = [b.communicate(timeout=60)[0].strip() for b in builders]
    assert [b.returncode for b in builders] == [0, 0]
    assert outputs[0] == outputs[1] in ("['Afirst', 'Asecond']", "['Bfirst', 'Bsecond']")
    assert [p.name for p in tmp_path.iterdir()] == ["entry"]  # the loser's copy is gone


def test_engines_loaded_in_three_threads_at_once_all_load_whole(tiny: TransformersEngine) -> None:
    """Three envs started together load three engines at once (the suite's parallel tests do);
    transformers' loading is not thread-safe, so the engine's loads take turns. Without that,
    every one of the three failed ("Cannot copy out of meta tensor")."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(load_engine, "tiny") for _ in range(3)]
    engines = [f.result() for f in futures if f.exception() is None]
    try:
        assert [f.exception() for f in futures] == [None] * 3
        expected = tiny.score([1, 2, 3], [4, 5])
        assert [engine.score([1, 2, 3], [4, 5]) for engine in engines] == [expected] * 3
    finally:
        for engine in engines:
            engine.close()


def test_the_tiny_template_renders_a_tool_conversation_exactly(tiny: TransformersEngine) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "bash",
                "description": "Run",
                "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
            },
        }
    ]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "List files"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"type": "function", "function": {"name": "bash", "arguments": {"command": "ls"}}},
                {
                    "type": "function",
                    "function": {"name": "bash", "arguments": '{"command":"pwd"}'},
                },
            ],
        },
        {"role": "tool", "content": "a.py"},
        {"role": "tool", "content": "/work"},
        {"role": "assistant", "content": "Done."},
    ]
    text = tiny.tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=True
    )
    assert text == (
        "<|im_start|>system\nBe brief.\n\n# Tools\n\n"
        "You may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        '{"type": "function", "function": {"name": "bash", "description": "Run", "parameters": '
        '{"type": "object", "properties": {"command": {"type": "string"}}}}}\n</tools>\n\n'
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nList files<|im_end|>\n"
        "<|im_start|>assistant\n"
        '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "bash", "arguments": {"command":"pwd"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\na.py\n</tool_response>\n"
        "<tool_response>\n/work\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nDone.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    plain = tiny.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert plain == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_a_seed_gives_the_same_tokens_streamed_or_generated(
    tiny: TransformersEngine, prompt: list[int]
) -> None:
    sampling = SamplingParams(temperature=1.0, max_tokens=40, seed=7)
    tiny.clear_prefix_cache()  # both runs compute the prompt whole: bit-identical numerics
    chunks = collect(tiny, prompt, sampling)
    assert all(len(c.token_ids) == len(c.logprobs) == 1 for c in chunks)  # one chunk per token
    assert [c.finish_reason for c in chunks] == [None] * 39 + ["length"]
    tiny.clear_prefix_cache()
    completion = generate(tiny, prompt, sampling)
    assert completion.token_ids == [c.token_ids[0] for c in chunks]
    assert completion.logprobs == [c.logprobs[0] for c in chunks]
    other = generate(tiny, prompt, SamplingParams(temperature=1.0, max_tokens=40, seed=8))
    assert other.token_ids != completion.token_ids


def test_rescoring_a_sampled_completion_reproduces_its_logprobs(
    tiny: TransformersEngine, prompt: list[int]
) -> None:
    completion = generate(tiny, prompt, SamplingParams(temperature=1.0, max_tokens=64, seed=3))
    rescored = tiny.score(prompt, completion.token_ids)
    assert len(rescored) == 64
    assert max(abs(a - b) for a, b in zip(rescored, completion.logprobs)) < 1e-4
    assert asyncio.run(tiny.ascore(prompt, completion.token_ids)) == rescored
    assert tiny.score(prompt, []) == []


def test_processed_logprobs_follow_temperature_top_k_and_top_p(
    tiny: TransformersEngine, prompt: list[int]
) -> None:
    temperature, top_k, top_p = 0.7, 50, 0.9
    sampling = SamplingParams(
        temperature=temperature, top_k=top_k, top_p=top_p, max_tokens=24, seed=11
    )
    completion = generate(tiny, prompt, sampling)
    logits = forward_logits(tiny, prompt + completion.token_ids[:-1])[len(prompt) - 1 :]
    for row, token, reported in zip(logits, completion.token_ids, completion.logprobs):
        probs = torch.softmax(row / temperature, dim=-1)
        kept, order = torch.topk(probs, top_k)  # descending
        kept = kept / kept.sum()
        mass_before = kept.cumsum(0) - kept
        kept, order = kept[mass_before < top_p], order[mass_before < top_p]
        assert token in order.tolist()
        expected = torch.log(kept / kept.sum())[order.tolist().index(token)]
        assert abs(float(expected) - reported) < 1e-4

    greedy = generate(tiny, prompt, SamplingParams(temperature=0, max_tokens=8))
    raw = torch.log_softmax(forward_logits(tiny, prompt + greedy.token_ids[:-1]), dim=-1)
    for row, token, reported in zip(raw[len(prompt) - 1 :], greedy.token_ids, greedy.logprobs):
        assert token == int(row.argmax())
        assert abs(float(row[token]) - reported) < 1e-4


def test_a_stop_token_ends_the_stream_and_is_part_of_the_completion(
    tiny: TransformersEngine, prompt: list[int]
) -> None:
    greedy = generate(tiny, prompt, SamplingParams(temperature=0, max_tokens=12))
    assert greedy.finish_reason == "length" and len(greedy.token_ids) == 12
    stop = greedy.token_ids[5]
    first = greedy.token_ids.index(stop)
    stopped = generate(
        tiny, prompt, SamplingParams(temperature=0, max_tokens=12, stop_token_ids=(stop,))
    )
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == greedy.token_ids[: first + 1]
    assert stopped.logprobs == pytest.approx(greedy.logprobs[: first + 1], abs=1e-6)
    im_end = tiny.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert im_end in tiny.stop_token_ids


def test_a_prompt_that_does_not_fit_raises_context_length_exceeded(
    tiny: TransformersEngine, prompt: list[int]
) -> None:
    with pytest.raises(ContextLengthExceeded) as raised:
        tiny.stream([1] * tiny.max_context, SamplingParams())
    assert raised.value.max_context == tiny.max_context == 131072
    # A completion that reaches the end of the context stops with "length".
    short = TransformersEngine(tiny.model, tiny.tokenizer, max_context=len(prompt) + 5)
    try:
        completion = generate(short, prompt, SamplingParams(max_tokens=100, seed=0))
        assert completion.finish_reason == "length" and len(completion.token_ids) == 5
    finally:
        short.close()


def test_bad_token_ids_are_rejected_with_value_error(tiny: TransformersEngine) -> None:
    with pytest.raises(ValueError, match="empty"):
        tiny.stream([], SamplingParams())
    with pytest.raises(ValueError, match="outside the vocabulary"):
        generate(tiny, [1, 2, 10**6], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tiny.score([1, 2], [-1])


def test_concurrent_streams_all_progress_and_each_matches_its_solo_run(
    tiny: TransformersEngine, prompt: list[int]
) -> None:
    n_tokens = 300

    async def one(seed: int, t0: float) -> tuple[float, float, list[int]]:
        first, tokens = None, []
        async for chunk in tiny.stream(prompt, SamplingParams(max_tokens=n_tokens, seed=seed)):
            first = first or time.perf_counter() - t0
            tokens += chunk.token_ids
        return first, time.perf_counter() - t0, tokens

    async def run() -> list[tuple[float, float, list[int]]]:
        t0 = time.perf_counter()
        return await asyncio.gather(*(one(seed, t0) for seed in range(4)))

    results = asyncio.run(run())
    firsts, ends = [r[0] for r in results], [r[1] for r in results]
    assert all(len(r[2]) == n_tokens for r in results)
    assert max(firsts) < min(ends) / 4  # every stream started long before any finished
    solo = generate(tiny, prompt, SamplingParams(max_tokens=n_tokens, seed=2))
    assert solo.token_ids == results[2][2]


def test_leaving_a_stream_stops_the_worker_generating(
    tiny: TransformersEngine, prompt: list[int]
) -> None:
    endless = SamplingParams(max_tokens=100_000, seed=0)

    async def close_after_five() -> None:
        stream = tiny.stream(prompt, endless)
        for _ in range(5):
            await anext(stream)
        await stream.aclose()

    async def cancel_consumer() -> None:
        async def consume() -> None:
            async for _ in tiny.stream(prompt, endless):
                pass

        task = asyncio.create_task(consume())
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    async def break_out() -> None:
        async for _ in tiny.stream(prompt, endless):
            break  # the abandoned generator is finalized (and closed) by the event loop

    async def tokens_after(leave) -> tuple[int, int]:
        # Measured inside the same event loop: once a loop closes, the worker would notice that
        # on its own and the test would prove nothing.
        await leave()
        await asyncio.sleep(0.1)  # one step at most
        produced = tiny.tokens_generated
        await asyncio.sleep(0.3)
        return produced, tiny.tokens_generated

    for leave in (close_after_five, cancel_consumer, break_out):
        before, after = asyncio.run(tokens_after(leave))
        assert after == before, leave.__name__
        assert tiny.active_requests == 0


def test_a_25k_token_prompt_is_accepted_by_tiny(tiny: TransformersEngine) -> None:
    long_prompt = [(i * 7919) % 8000 + 7 for i in range(25_000)]
    started = time.perf_counter()
    completion = generate(tiny, long_prompt, SamplingParams(max_tokens=4, seed=0))
    assert len(completion.token_ids) == 4
    assert time.perf_counter() - started < 30


def test_a_closed_engine_aborts_open_streams_and_refuses_new_ones(
    tiny: TransformersEngine, prompt: list[int]
) -> None:
    engine = TransformersEngine(tiny.model, tiny.tokenizer)

    async def run() -> list:
        chunks = []
        async for chunk in engine.stream(prompt, SamplingParams(max_tokens=100_000, seed=0)):
            chunks.append(chunk)
            if len(chunks) == 3:
                await engine.aclose()
        return chunks

    chunks = asyncio.run(run())
    assert chunks[-1].finish_reason == "abort" and chunks[-1].token_ids == []
    with pytest.raises(EngineError, match="closed"):
        engine.stream(prompt, SamplingParams())
    with pytest.raises(EngineError, match="closed"):
        engine.score(prompt, [1])


def test_load_engine_resolves_spec_strings_through_entry_points(tiny: TransformersEngine) -> None:
    assert {"tiny", "smollm2", "hf"} <= set(available_engines())
    assert load_engine(tiny) is tiny
    with pytest.raises(ValueError, match="unknown engine .no-such-engine.*tiny"):  # lists them
        load_engine("no-such-engine")
    with pytest.raises(ValueError, match="no argument"):
        load_engine("tiny:extra")
    hf = load_engine(f"hf:{tiny_model_dir()}")
    try:
        assert hf.max_context == 131072 and set(hf.stop_token_ids) == set(tiny.stop_token_ids)
    finally:
        asyncio.run(hf.aclose())


@pytest.mark.slow
def test_smollm2_answers_a_chat_prompt_greedily() -> None:
    pytest.importorskip("gguf")
    engine = load_engine("smollm2")
    try:
        ids = engine.tokenizer.apply_chat_template(
            [{"role": "user", "content": "What is the capital of France?"}],
            add_generation_prompt=True,
            return_dict=False,
        )
        completion = generate(engine, ids, SamplingParams(temperature=0, max_tokens=32))
        text = engine.tokenizer.decode(completion.token_ids, skip_special_tokens=True)
        assert completion.finish_reason == "stop" and "Paris" in text
        rescored = engine.score(ids, completion.token_ids)
        assert max(abs(a - b) for a, b in zip(rescored, completion.logprobs)) < 1e-3
    finally:
        engine.close()
