"""Policy versions, real end to end at the wire: vLLM 0.33 reports which weights sampled each
call (`return_weight_versions`), and TRL's weight syncs leave that label as it was, so the
trainer side labels the new weights (`VLLMEngine.set_weight_version`).

TRL's own client classes (1.16, as installed) make the weight-sync calls against
`support/vllm_wire_server.py`, a wire-protocol fake of a dev-mode vLLM server; the NCCL transfer
of the tensors themselves cannot run here, so `/update_weights` is sent with TRL's body shape and
no tensors follow."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from types import SimpleNamespace

import openai
import pytest
import requests
from support.vllm_wire_server import VLLMWireServer

from harness_gym.engines import SamplingParams
from harness_gym.engines.vllm import VLLMConfigError, VLLMEngine, WeightVersionSpan
from harness_gym.integrations.trl import tag_policy_version
from harness_gym.proxy import InterceptionProxy

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


@pytest.fixture(scope="module")
def server(tiny):
    with VLLMWireServer(tiny, logprobs_mode="processed_logprobs", dev_mode=True) as running:
        yield running


@pytest.fixture
def engine(server):
    server.reset()
    built = VLLMEngine([server.url], tokenizer="tiny")
    yield built
    built.close()


def trl_sync_client(url: str):
    """TRL's `GRPOTrainer` client (`trl.generation.vllm_client.VLLMClient`). Its constructor
    wants vLLM installed (for NCCL), so the object is built around a plain `requests` session;
    the methods called are TRL's own."""
    from trl.generation.vllm_client import VLLMClient

    client = VLLMClient.__new__(VLLMClient)
    client.session, client.base_url, client._updating_weights = requests.Session(), url, False
    return client


def trl_sync_weight_update(url: str) -> None:
    """What `VLLMClient.update_named_params` + `reset_prefix_cache` send for one sync."""
    client = trl_sync_client(url)
    client._start_weight_update()  # POST /start_weight_update {}
    requests.post(f"{url}/update_weights", json={"update_info": {
        "names": ["w"], "dtype_names": ["float32"], "shapes": [[1]]}}).raise_for_status()
    client._finish_weight_update()  # POST /finish_weight_update {}: no version
    client.reset_prefix_cache()


def call_through_proxy(proxy, session, text: str) -> dict:
    client = openai.OpenAI(base_url=proxy.base_url, api_key=session.session_id, max_retries=0)
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": text}])
    return session.trace_json()["segments"][-1]


def test_a_server_never_labelled_says_default_and_calls_keep_the_trainers_version(engine,
                                                                                    server):
    engine.policy_version = 3
    with InterceptionProxy(engine) as proxy:
        session = proxy.open_session(sampling={"max_tokens": 4})
        segment = call_through_proxy(proxy, session, "hi")
    assert segment["policy_versions"] == [3]
    [call] = server.calls
    assert call.body["return_weight_versions"] is True
    assert call.weight_versions == [{"version": "default", "start": 0,
                                     "end": len(call.token_ids)}]


def test_after_trls_sync_weight_update_the_next_calls_record_the_new_version(engine, server):
    trainer = SimpleNamespace(args=SimpleNamespace(use_vllm=True, vllm_mode="server"))
    with InterceptionProxy(engine) as proxy:
        session = proxy.open_session(sampling={"max_tokens": 4})
        tag_policy_version(engine, 0, trainer)  # what our rollout_func does at step 0
        assert call_through_proxy(proxy, session, "before")["policy_versions"] == [0]
        trl_sync_weight_update(server.url)
        assert server.weight_version == "0"  # TRL's empty finish left the label alone
        tag_policy_version(engine, 1, trainer)  # the next rollout_func call, at step 1
        assert call_through_proxy(proxy, session, "after")["policy_versions"] == [1]
    paths = [path for path, _ in server.control]
    assert paths == ["/update_weight_version", "/start_weight_update", "/update_weights",
                     "/finish_weight_update", "/reset_prefix_cache", "/update_weight_version"]
    assert server.control[3] == ("/finish_weight_update", {})  # TRL sends `json={}`


def test_the_servers_label_beats_the_trainers_fallback(engine, server):
    # Another process (the trainer) labelled the weights; this engine's fallback is stale.
    requests.post(f"{server.url}/update_weight_version", json={"new_version": "5"})
    engine.policy_version = 2
    with InterceptionProxy(engine) as proxy:
        session = proxy.open_session(sampling={"max_tokens": 4})
        assert call_through_proxy(proxy, session, "hi")["policy_versions"] == [5]


def test_finish_weight_update_with_a_version_labels_the_weights(engine, server):
    requests.post(f"{server.url}/finish_weight_update", json={"weight_version": "9"})
    stream, _ = asyncio.run(_collect(engine, "hi"))
    assert stream.policy_version == 9


def test_async_trainer_sync_a_call_straddling_it_records_its_oldest_tokens_version(engine,
                                                                                   server):
    """`AsyncGRPOTrainer._sync_weight`: pause(mode=keep), `WeightTransferClient.send_weights`
    (start, update, finish with no body), then resume; in-flight calls wait and go on."""
    from trl.experimental.async_grpo.vllm_client import VLLMClient

    trl_client = VLLMClient(server.url)
    engine.set_weight_version(0)
    server.hold(after_tokens=3)
    result: dict = {}
    worker = threading.Thread(target=lambda: result.update(
        zip(("stream", "chunks"), asyncio.run(_collect(engine, "straddle", max_tokens=8)))))
    worker.start()
    _wait_for(lambda: server.calls and len(server.calls[-1].token_ids) >= 3)
    trl_client.pause()  # POST /pause?mode=keep
    server.release()  # the next token is sampled, then waits for /resume
    trl_client.start_weight_update()
    trl_client.update_weights({"names": ["w"], "dtype_names": ["float32"], "shapes": [[1]]})
    trl_client.finish_weight_update()  # POST /finish_weight_update, no body: label unchanged
    assert server.weight_version == "0"
    engine.set_weight_version(1)  # the weight transfer labels the new weights before /resume
    trl_client.resume()
    worker.join(30)
    stream = result["stream"]
    n = len(server.calls[-1].token_ids)
    assert stream.weight_versions == [WeightVersionSpan("0", 0, 3), WeightVersionSpan("1", 3, n)]
    assert stream.policy_version == 0  # the oldest policy among its tokens
    after, _ = asyncio.run(_collect(engine, "after"))
    assert after.policy_version == 1
    assert ("/pause", None) in server.control and ("/finish_weight_update", None) in server.control


def test_labelling_a_server_without_dev_mode_says_how_to_start_it(tiny):
    with VLLMWireServer(tiny, logprobs_mode="processed_logprobs") as plain:
        engine = VLLMEngine([plain.url], tokenizer="tiny")
        with pytest.raises(VLLMConfigError, match="VLLM_SERVER_DEV_MODE=1"):
            engine.set_weight_version(1)
        engine.close()


def test_the_label_is_sent_as_the_string_vllm_declares(engine, server):
    asyncio.run(engine.aset_weight_version(4))
    assert server.control[-1] == ("/update_weight_version", {"new_version": "4"})
    assert engine.policy_version == 4 and server.weight_version == "4"


async def _collect(engine: VLLMEngine, text: str, max_tokens: int = 4):
    ids = engine.tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                               add_generation_prompt=True, return_dict=False)
    stream = engine.stream(ids, SamplingParams(max_tokens=max_tokens, seed=0))
    chunks = [chunk async for chunk in stream]
    return stream, chunks


def _wait_for(condition, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)
