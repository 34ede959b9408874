"""Each call's sampling (temperature, top-p, top-k, max_tokens, seed) lands in its segment, one
entry per call, with the response offset where the call's tokens start: what a trainer needs to
re-score a call under the distribution that drew it. Real proxy, real HTTP, the official openai
SDK, the tiny model sampling. And the re-scores agree with what was recorded: a nucleus-sampled
call's logprobs are its tokens' under the renormalised nucleus, both in the asynchronous path's
`rescored_logprobs` and in the learning curve's `FrozenPrefixGRPOTrainer` (TRL's own scorer
divides by the temperature only, and differs).
"""

from __future__ import annotations

import openai
import pytest
import torch

from harness_gym.engines import load_engine
from harness_gym.engines.tiny import load_tiny_tokenizer, tiny_model_dir
from harness_gym.integrations.rescore import call_spans, rescored_logprobs
from harness_gym.proxy import InterceptionProxy


@pytest.fixture(scope="module")
def proxy():
    engine = load_engine("tiny")
    proxy = InterceptionProxy(engine).start()
    yield proxy
    proxy.stop()
    engine.close()


def client_for(proxy: InterceptionProxy, **sampling):
    session = proxy.open_session(sampling=sampling or None)
    return session, openai.OpenAI(base_url=proxy.base_url, api_key=session.session_id,
                                  max_retries=0)


def ask(client, messages, stream: bool = False, **kw) -> dict:
    answer = client.chat.completions.create(model="policy", messages=messages, stream=stream, **kw)
    if stream:
        text = "".join(c.choices[0].delta.content or "" for c in answer if c.choices)
    else:
        text = answer.choices[0].message.content or ""
    return {"role": "assistant", "content": text}


def test_the_sessions_sampling_is_recorded_for_every_call(proxy):
    session, client = client_for(proxy, temperature=0.5, top_k=7, seed=11, max_tokens=9)
    history = [{"role": "user", "content": "Say something."}]
    history.append(ask(client, history, temperature=1.3, max_tokens=20))  # the session wins
    history.append({"role": "user", "content": "And again."})
    ask(client, history, stream=True)

    (segment,) = session.trace.to_dicts()
    assert segment["n_calls"] == 2
    assert segment["sampling_temperature"] == [0.5, 0.5]
    assert segment["sampling_top_p"] == [1.0, 1.0]
    assert segment["sampling_top_k"] == [7, 7]
    assert segment["sampling_max_tokens"] == [9, 9]  # the session's cap under the request's 20
    assert segment["sampling_seed"] == [11, 11]
    # Call 0's tokens start the response; call 1's start after them (its inserted user turn,
    # then what it sampled).
    first = session.trace.calls[0].completion_tokens
    assert segment["call_starts"] == [0, first]
    assert segment["loss_mask"][:first] == [1] * first
    assert segment["loss_mask"][first] == 0


def test_without_overrides_the_request_sampling_is_what_is_recorded(proxy):
    session, client = client_for(proxy)
    ask(client, [{"role": "user", "content": "Hi."}], temperature=0.25, top_p=0.9, max_tokens=5)
    (segment,) = session.trace.to_dicts()
    assert segment["sampling_temperature"] == [0.25]
    assert segment["sampling_top_p"] == [0.9]
    assert segment["sampling_max_tokens"] == [5]
    assert segment["sampling_seed"] == [None]


def test_a_retried_call_keeps_its_sampling_in_the_discarded_segment(proxy):
    session, client = client_for(proxy, temperature=0.8, max_tokens=4)
    messages = [{"role": "user", "content": "Once."}]
    ask(client, messages)
    ask(client, messages)  # the identical request again: a retry
    segments = session.trace.to_dicts()
    assert [s["role"] for s in segments] == ["agent", "discarded"]
    for segment in segments:
        assert segment["n_calls"] == 1
        assert segment["sampling_temperature"] == [0.8]
        assert segment["call_starts"] == [0]


NUCLEUS = {"temperature": 0.8, "top_p": 0.9, "top_k": 50}


@pytest.fixture(scope="module")
def nucleus_segment(proxy) -> dict:
    """One call sampled from a nucleus through the proxy, as its trace recorded it."""
    session, client = client_for(proxy, **NUCLEUS, seed=5, max_tokens=24)
    ask(client, [{"role": "user", "content": "Tell me something long."}])
    (segment,) = session.trace.to_dicts()
    assert segment["sampling_top_p"] == [0.9] and segment["sampling_top_k"] == [50]
    assert sum(segment["loss_mask"]) >= 8
    return segment


def test_a_nucleus_sampled_calls_logprobs_are_its_rescore_under_the_recorded_sampling(
        nucleus_segment):
    from transformers import AutoModelForCausalLM

    segment = nucleus_segment
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir(), dtype=torch.float32)
    ids = segment["prompt_ids"] + segment["response_ids"]
    first = len(segment["prompt_ids"])
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, first - 1:-1]
    rescored = rescored_logprobs(logits, torch.tensor(ids[first:]), call_spans(segment), first)
    recorded = torch.tensor(segment["response_logprobs"])
    assert torch.allclose(rescored, recorded, atol=1e-4)
    plain = torch.log_softmax(logits / NUCLEUS["temperature"], -1)  # the full vocabulary
    plain = plain.gather(1, torch.tensor(ids[first:])[:, None])[:, 0]
    assert (plain - recorded).abs().max() > 1e-2  # the nucleus's renormalisation is seen


def test_the_learning_curves_grpo_trainer_scores_rollouts_under_their_nucleus(
        nucleus_segment, tmp_path):
    """The learning curve's GRPO arms sample with `top_p`/`top_k` (`CurveConfig.grpo_top_p`,
    through `GRPOConfig`): its trainer's logprobs of a rollout must be the recorded ones."""
    pytest.importorskip("trl")
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from harness_gym.training.trainers import FrozenPrefixGRPOTrainer

    segment = nucleus_segment
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2,
                      max_completion_length=64, report_to="none", use_cpu=True, bf16=False,
                      **NUCLEUS)
    trainer = FrozenPrefixGRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_model_dir(), dtype=torch.float32),
        processing_class=load_tiny_tokenizer(), args=args,
        train_dataset=Dataset.from_dict({"prompt": ["a", "b"]}),
        reward_funcs=lambda completions, **kw: [0.0] * len(completions))
    ids = torch.tensor([segment["prompt_ids"] + segment["response_ids"]])
    n = len(segment["response_ids"])
    mask = torch.ones_like(ids)
    ours, entropy, _ = trainer._get_per_token_logps_and_entropies(
        trainer.model, ids, mask, n, compute_entropy=True)
    recorded = torch.tensor(segment["response_logprobs"])
    assert torch.allclose(ours[0], recorded, atol=1e-4)
    assert torch.isfinite(entropy).all()
    theirs, _, _ = GRPOTrainer._get_per_token_logps_and_entropies(
        trainer, trainer.model, ids, mask, n)
    assert (theirs[0] - recorded).abs().max() > 1e-2  # TRL's: the temperature only

    # a token the nucleus left out (the last one, put in by hand) adds no gradient, is counted
    with torch.no_grad():
        last = trainer.model(input_ids=ids).logits[0, -2]
    ids[0, -1] = int(last.argmin())
    out, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, n)
    assert out[0, -1] == 0 and torch.isfinite(out).all()
    assert torch.allclose(out[0, :-1], recorded[:-1], atol=1e-4)
    assert trainer.frozen_prefix_stats()["tokens_outside_kept"] == 1
