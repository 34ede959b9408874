"""Weights reach the engine that serves the episodes (issue 15, item 4).

CPU: the in-process transformers engine takes new weights between model calls, never inside
one (`pause` waits for running generations, calls that arrive meanwhile wait for `resume`), and
each call records the version that served it. GPU: `VLLMWeightTransfer` around TRL 1.16's own
`VLLMClient`, at the wire level only, against `support/vllm_wire_server.py` (no NCCL transfer and
no vLLM can run here).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import numpy as np
import openai
import pytest
import torch

pytest.importorskip("trl")

from support.vllm_wire_server import VLLMWireServer
from support.weights import weights_digest

from harness_gym.engines import SamplingParams, load_engine
from harness_gym.engines.vllm import VLLMEngine
from harness_gym.engines.weight_updates import WeightUpdateError
from harness_gym.episode import EpisodeResult
from harness_gym.integrations.weight_transfer import EngineWeightTransfer, VLLMWeightTransfer
from harness_gym.proxy import InterceptionProxy


# --- weights into the in-process engine ---------------------------------------------------


def test_a_call_running_at_pause_ends_on_the_old_weights_and_a_waiting_one_starts_on_the_new():
    engine, reference = load_engine("tiny"), load_engine("tiny")  # reference keeps the old weights
    try:
        transfer = EngineWeightTransfer(engine, drain_timeout_s=120)
        prompt = engine.tokenizer.apply_chat_template(
            [{"role": "user", "content": "hi"}], add_generation_prompt=True, return_dict=False)
        new = [(name, p.detach() + 0.05 * torch.randn_like(p))
               for name, p in engine.model.named_parameters()]
        results: dict[str, Any] = {}

        def call(key: str, max_tokens: int) -> None:
            async def run() -> None:
                stream = engine.stream(prompt, SamplingParams(max_tokens=max_tokens, seed=1))
                chunks = [chunk async for chunk in stream]
                results[key] = (stream.policy_version, [t for c in chunks for t in c.token_ids],
                                [x for c in chunks for x in c.logprobs])
            asyncio.run(run())

        running = threading.Thread(target=call, args=("running", 96))
        running.start()
        deadline = time.monotonic() + 60
        while engine.tokens_generated == 0:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        transfer.pause()  # returns once the running generation has ended on the engine
        assert engine.active_requests == 0
        running.join(60)  # its consumer may still be reading the chunks already delivered
        assert "running" in results
        waiting = threading.Thread(target=call, args=("waiting", 8))
        waiting.start()
        time.sleep(0.5)
        assert "waiting" not in results and engine.active_requests == 1  # held back
        transfer.send_weights(iter(new))
        transfer.resume()
        waiting.join(60)
        old_version, old_tokens, old_logprobs = results["running"]
        new_version, new_tokens, new_logprobs = results["waiting"]
        assert (old_version, new_version) == (None, 1)  # never-loaded weights carry no version
        assert len(old_tokens) == 96
        # Every token of the running call is scored by the OLD weights, those after by the new.
        assert np.allclose(old_logprobs, reference.score(prompt, old_tokens), atol=1e-4)
        assert np.allclose(new_logprobs, engine.score(prompt, new_tokens), atol=1e-4)
        assert not np.allclose(new_logprobs, reference.score(prompt, new_tokens), atol=1e-3)
    finally:
        engine.close()
        reference.close()


def test_each_call_of_a_session_records_the_version_that_served_it(tmp_path):
    engine = load_engine("tiny")
    transfer = EngineWeightTransfer(engine)
    try:
        with InterceptionProxy(engine) as proxy:
            session = proxy.open_session(sampling={"max_tokens": 4})  # no version of its own
            client = openai.OpenAI(base_url=proxy.base_url, api_key=session.session_id,
                                   max_retries=0)
            messages = [{"role": "user", "content": "first"}]
            for turn in range(3):
                answer = client.chat.completions.create(model="tiny", messages=messages)
                messages += [{"role": "assistant", "content": answer.choices[0].message.content},
                             {"role": "user", "content": f"turn {turn}"}]
                transfer.pause()  # a weight sync between two calls of one episode
                transfer.send_weights(iter(engine.model.named_parameters()))
                transfer.resume()
            trace = session.trace.snapshot()
        (segment,) = trace.to_dicts()  # the episode went on across the updates: one segment
        assert segment["policy_versions"] == [0, 1, 2] and segment["policy_version"] == 0
        info = EpisodeResult("t", "none", "failed", 0.0, {}, trace=trace).info()
        assert (info["policy_version_min"], info["policy_version_max"]) == (0, 2)
    finally:
        engine.close()


def test_weights_with_an_unknown_name_or_shape_are_refused_whole(tiny):
    before = weights_digest(tiny.model)
    params = dict(tiny.model.named_parameters())
    name = next(iter(params))
    transfer = EngineWeightTransfer(tiny)
    transfer.pause()
    try:
        ok = [(name, params[name].detach() + 1.0)]
        with pytest.raises(WeightUpdateError, match="no parameter 'lm_head.bogus'"):
            transfer.send_weights(iter(ok + [("lm_head.bogus", torch.zeros(3))]))
        with pytest.raises(WeightUpdateError, match="shape"):
            transfer.send_weights(iter(ok + [(name, torch.zeros(1, 2, 3))]))
    finally:
        transfer.resume()
    assert weights_digest(tiny.model) == before  # nothing copied from a refused stream
    with pytest.raises(WeightUpdateError, match="pause"):  # between calls only
        request = threading.Thread(target=lambda: asyncio.run(tiny.generate(
            [1, 2, 3], SamplingParams(max_tokens=200, seed=0))))
        request.start()
        while tiny.active_requests == 0:
            time.sleep(0.01)
        try:
            tiny.load_weights(iter(ok), version=9)
        finally:
            request.join(60)


# --- vLLM at the wire ---------------------------------------------------------------------


class TRLWireTransfer:
    """The HTTP calls of TRL 1.16's `WeightTransferClient` (`pause`, `send_weights`: start,
    update, finish with no body; `resume`), made by TRL's own `VLLMClient`. The NCCL stream of
    the tensors cannot run here, so `/update_weights` carries the manifest and nothing follows."""

    def __init__(self, url: str) -> None:
        from accelerate import PartialState
        from trl.experimental.async_grpo.vllm_client import VLLMClient

        PartialState(cpu=True)  # TRL's client logs through accelerate, which wants its state
        self.client = VLLMClient(url)

    def init_weight_transfer(self) -> None:
        self.client.wait_for_server_ready()

    def pause(self) -> None:
        self.client.pause()

    def send_weights(self, iterator) -> None:
        tensors = list(iterator)
        self.client.start_weight_update()
        self.client.update_weights({
            "names": [n for n, _ in tensors],
            "dtype_names": [str(t.dtype).split(".")[-1] for _, t in tensors],
            "shapes": [list(t.shape) for _, t in tensors]})
        self.client.finish_weight_update()

    def resume(self) -> None:
        self.client.resume()

    def destroy(self) -> None: ...


def test_a_vllm_weight_transfer_labels_the_servers_weights_before_resume(tiny):
    with VLLMWireServer(tiny, logprobs_mode="processed_logprobs", dev_mode=True) as server:
        engine = VLLMEngine([server.url], tokenizer="tiny")
        transfer = VLLMWeightTransfer(engine, TRLWireTransfer(server.url))
        try:
            transfer.init_weight_transfer()
            for _ in range(2):  # AsyncGRPOTrainer._sync_weight_merged's order
                transfer.pause()
                transfer.send_weights(iter([("w", torch.zeros(2, 3))]))
                transfer.resume()
            with InterceptionProxy(engine) as proxy:
                session = proxy.open_session(sampling={"max_tokens": 4})
                openai.OpenAI(base_url=proxy.base_url, api_key=session.session_id,
                              max_retries=0).chat.completions.create(
                    model="tiny", messages=[{"role": "user", "content": "hi"}])
                segment = session.trace_json()["segments"][0]
        finally:
            engine.close()
    paths = [(path, body) for path, body in server.control if path != "/get_world_size"]
    one_sync = ["/pause", "/start_weight_update", "/update_weights", "/finish_weight_update",
                "/update_weight_version", "/resume"]
    assert [p for p, _ in paths] == one_sync * 2
    assert paths[3] == ("/finish_weight_update", None)  # TRL's finish labels nothing
    assert [b for p, b in paths if p == "/update_weight_version"] == [
        {"new_version": "1"}, {"new_version": "2"}]
    assert segment["policy_versions"] == [2]  # the server's label, on the call
    assert server.calls[-1].weight_versions[0]["version"] == "2"
