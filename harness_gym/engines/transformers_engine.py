"""`TransformersEngine`: an in-process transformers causal LM behind the `Engine` seam.

Generation runs on one worker thread (see `_decode_worker`); this module is the asyncio face of
it: each stream hands the worker a request whose chunks come back through an `asyncio.Queue`,
and leaving the stream (closing it, breaking out, or cancelling its task) tells the worker to
drop the request at its next step.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from ._decode_worker import DecodeRequest, DecodeWorker
from .prefix_cache import DEFAULT_MAX_BYTES
from .base import (
    NO_CONTEXT,
    ContextLengthExceeded,
    Engine,
    EngineError,
    RequestContext,
    SamplingParams,
    TokenChunk,
)
from .weight_updates import LabelledStream, ServedVersion, WeightUpdateError, copy_named_weights


# transformers builds a model on the meta device while `from_pretrained` runs, through state it
# holds for the whole process: two loads in two threads at once break each other ("Cannot copy
# out of meta tensor", lm_head reported MISSING: 9 of 9 loads failed, three threads at a time).
# Loads in one process take turns; generation does not.
_LOADING = threading.Lock()


class TransformersEngine(Engine):
    """Samples from a transformers causal LM on this machine.

    Several concurrent streams progress together (one token each per round). The same
    `SamplingParams.seed` gives the same tokens whether the stream is consumed chunk by chunk or
    through `generate()`, alone or alongside other streams.

    `num_threads` is the worker's CPU threads (default: all cores but one, so the event loop and
    the harness processes keep a core; see `_decode_worker` for the measurements).

    Prompts reuse the keys and values of the longest prefix an earlier request computed
    (`prefix_cache_bytes` bounds them; 0 turns it off; see `prefix_cache`): an agent's next call
    runs only its new tokens, and episodes share their system prompt's. Entries computed under
    other weights are never reused; `clear_prefix_cache()` is only needed after writes through
    `param.data`, which torch does not track.

    >>> import asyncio
    >>> from harness_gym.engines import SamplingParams, load_engine
    >>> engine = load_engine("tiny")
    >>> ids = engine.tokenizer.apply_chat_template(
    ...     [{"role": "user", "content": "hi"}], add_generation_prompt=True, return_dict=False)
    >>> out = asyncio.run(engine.generate(ids, SamplingParams(max_tokens=8, seed=0)))
    >>> len(out.token_ids) == len(out.logprobs) == 8, out.finish_reason
    (True, 'length')
    >>> engine.close()
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        model_name: str = "policy",
        max_context: int | None = None,
        stop_token_ids: Iterable[int] = (),
        num_threads: int | None = None,
        tokenizer_source: str | None = None,
        prefix_cache_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self.model = model.eval()
        self._tokenizer = tokenizer
        self.model_name = model_name
        self.tokenizer_source = tokenizer_source or _local_dir(tokenizer)
        self.max_context = int(max_context or _config_max_context(model.config))
        self.stop_token_ids = tuple(dict.fromkeys(int(t) for t in stop_token_ids))
        self._worker = DecodeWorker(
            model, max_context=self.max_context, name=model_name, num_threads=num_threads,
            prefix_cache_bytes=prefix_cache_bytes,
        )
        # The version of the loaded weights, once `load_weights` has named one (see
        # `weight_updates`); each stream reports it as its `policy_version`.
        self.weights_version: int | None = None

    @classmethod
    def from_pretrained(
        cls,
        directory: str | Path,
        *,
        model_name: str | None = None,
        chat_template: str | None = None,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        num_threads: int | None = None,
        tokenizer_source: str | None = None,
        prefix_cache_bytes: int = DEFAULT_MAX_BYTES,
    ) -> TransformersEngine:
        """Load a local model directory (never the network). Stop tokens: the generation
        config's and tokenizer's EOS, plus `<|im_end|>` when the vocabulary has it."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        directory = Path(directory).expanduser()
        if not directory.is_dir():
            raise FileNotFoundError(f"no model directory at {directory}")
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        if chat_template is not None:
            tokenizer.chat_template = chat_template
        with _LOADING, quiet_progress_bars():
            model = AutoModelForCausalLM.from_pretrained(
                directory, local_files_only=True, dtype=dtype
            )
            model.to(device)  # type: ignore[arg-type]  # transformers' stub for .to is too narrow
        return cls(
            model,
            tokenizer,
            model_name=model_name or directory.name,
            stop_token_ids=default_stop_token_ids(model, tokenizer),
            num_threads=num_threads,
            tokenizer_source=tokenizer_source or str(directory),
            prefix_cache_bytes=prefix_cache_bytes,
        )

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def active_requests(self) -> int:
        """Streams the worker is still generating for."""
        return self._worker.active_requests

    @property
    def tokens_generated(self) -> int:
        """Tokens sampled since the engine started, all streams together."""
        return self._worker.tokens_generated

    @property
    def prefix_cache_stats(self) -> dict[str, int]:
        """Prompts started (`lookups`), those that reused a cached prefix (`hits`), prompt tokens
        reused (`reused_tokens`) and run through the model (`computed_tokens`)."""
        return self._worker.prefix_cache.stats.as_dict()

    def clear_prefix_cache(self) -> None:
        """Drop every cached prefix (after the next round of the worker)."""
        self._worker.call(self._worker.prefix_cache.clear).result()

    def stream(
        self,
        prompt_ids: Sequence[int],
        sampling: SamplingParams,
        context: RequestContext = NO_CONTEXT,
    ) -> AsyncIterator[TokenChunk]:
        # One local model: the context routes nothing. Checked here, not at the first
        # iteration, so a caller can answer with an error before it starts a streamed response.
        prompt = list(prompt_ids)  # a private copy: the caller may reuse its list
        if not prompt:
            raise ValueError("prompt_ids is empty: a completion needs at least one prompt token")
        self.check_fits(len(prompt))
        self._worker.check_open()
        label = ServedVersion()
        return LabelledStream(self._stream(prompt, sampling, label), label)

    async def _stream(
        self, prompt: list[int], sampling: SamplingParams, label: ServedVersion
    ) -> AsyncIterator[TokenChunk]:
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue[TokenChunk | BaseException] = asyncio.Queue()
        request = DecodeRequest(
            prompt_ids=prompt,
            sampling=sampling,
            stop_token_ids=frozenset(self.stop_token_ids).union(sampling.stop_token_ids),
            generator=_generator(sampling.seed),
            deliver=lambda item: loop.call_soon_threadsafe(inbox.put_nowait, item),
            on_admit=lambda: setattr(label, "value", self.weights_version),
        )
        self._worker.submit(request)
        try:
            while True:
                item = await inbox.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finish_reason is not None:
                    return
        finally:
            request.cancel()

    def score(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> list[float]:
        """Teacher-forced raw (T=1) logprobs of `completion_ids` after `prompt_ids`, in one
        forward pass. Blocks the calling thread; from async code use `ascore`."""
        return self._score_future(prompt_ids, completion_ids).result()

    async def ascore(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> list[float]:
        """`score` without blocking the event loop."""
        return await asyncio.wrap_future(self._score_future(prompt_ids, completion_ids))

    def _score_future(
        self, prompt_ids: Sequence[int], completion_ids: Sequence[int]
    ) -> Future[list[float]]:
        prompt, completion = list(prompt_ids), list(completion_ids)
        if not prompt:
            raise ValueError("prompt_ids is empty: the first token has nothing to be scored after")
        if len(prompt) + len(completion) > self.max_context:
            raise ContextLengthExceeded(len(prompt) + len(completion), self.max_context)
        return self._worker.score(prompt, completion)

    # -- weight updates (see `weight_updates`) --------------------------------------------------

    def pause(self, timeout: float | None = None) -> None:
        """Start no new generation and wait for the running ones to end (blocking). Calls made
        meanwhile wait and start after `resume()`. Raises `EngineError` (resumed) on timeout."""
        self._worker.pause()
        if not self._worker.wait_idle(timeout):
            self._worker.resume()
            raise EngineError(f"the engine was still generating {timeout}s after pause()")

    def resume(self) -> None:
        self._worker.resume()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> int:
        """Copy `(name, tensor)` pairs into the model between `pause()` and `resume()`, on the
        decode thread, and label them `version` (also the engine's `policy_version`). Answers
        how many tensors were copied. Blocks."""
        received = list(weights)  # on the caller's thread: the iterator may gather shards

        def load() -> int:
            if self._worker.running_requests:
                raise WeightUpdateError("load_weights while generations run: pause() first")
            n = copy_named_weights(self.model, received)
            self.weights_version = self.policy_version = int(version)
            return n

        return self._worker.call(load).result()

    def close(self, timeout: float | None = None) -> None:
        """Stop the worker thread (blocking). Open streams end with finish_reason "abort"."""
        self._worker.close(timeout)


def load_hf_engine(path: str) -> TransformersEngine:
    """Entry point for the `hf:PATH` spec: any local transformers causal-LM directory."""
    if not path:
        raise ValueError("the hf engine needs a model directory: use 'hf:/path/to/model'")
    return TransformersEngine.from_pretrained(path)


def _local_dir(tokenizer: Any) -> str | None:
    """The directory a tokenizer was loaded from, when it is one (a reloadable source)."""
    name = getattr(tokenizer, "name_or_path", None)
    return str(name) if name and Path(name).is_dir() else None


@contextmanager
def quiet_progress_bars() -> Iterator[None]:
    """Without transformers' per-tensor progress bars: loading a cached model takes ~1 s, and
    its 272-step "Loading weights" bar on every engine start buried the CLI's own output."""
    from transformers.utils import logging

    enabled = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            logging.enable_progress_bar()


def _generator(seed: int | None) -> torch.Generator:
    generator = torch.Generator()
    if seed is None:
        generator.seed()  # nondeterministic, from the OS
    else:
        generator.manual_seed(seed)
    return generator


def _config_max_context(config: Any) -> int:
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    value = getattr(text_config, "max_position_embeddings", None)
    if not value:
        raise EngineError("the model config has no max_position_embeddings: pass max_context")
    return int(value)


def default_stop_token_ids(model: Any, tokenizer: Any) -> list[int]:
    stops: list[int] = []
    generation_config = getattr(model, "generation_config", None)
    eos = getattr(generation_config, "eos_token_id", None)
    stops.extend([eos] if isinstance(eos, int) else list(eos or []))
    if tokenizer.eos_token_id is not None:
        stops.append(tokenizer.eos_token_id)
    im_end = tokenizer.get_vocab().get("<|im_end|>")
    if im_end is not None:
        stops.append(im_end)
    return stops
