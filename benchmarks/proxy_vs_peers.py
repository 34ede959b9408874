"""harness-gym's production path (`serve --engine vllm:URL`) side by side with the peer proxies.

A wrapper around the side-by-side harness of the peers (a `shared/bench/peers/` folder beside
the checkout, or `$PEERS_DIR`; it is not part of this repository, README there): one
run of `run_with_harness_gym.sh` starts the zero-cost fake engine, verifiers' interception
server, OpenEnv's capture proxy, rllm-model-gateway and our proxy in front of it, drives the
same 30-turn tool conversation through each with the openai SDK (interleaved, so the ratios are
fair), and prints its table: overhead vs `direct` p50 / p90 / at turn 30, proxy CPU per call,
16-concurrent calls/s. Then this script measures the vLLM hop alone: our `VLLMEngine` against
the same fake engine, no proxy, on prompts of the workload's sizes (system prompt, 16 tools,
2 KB tool results, the fake's 65-token answer per turn), so the table says how much of our
overhead is the hop.

    .venv/bin/python benchmarks/proxy_vs_peers.py                  # REPS=10 CONC_REPS=3
    .venv/bin/python benchmarks/proxy_vs_peers.py --reps 3 --conc-reps 1 --hop-reps 3

Without that folder the benchmark says so and exits 0 (skipped): its fake engine and workload
come from there too. The side-by-side harness installs the peers into /tmp venvs on first use. The machine's load decides
the absolute figures: compare within one run. The load average is printed with the table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# `../shared/bench/peers` beside the checkout (one level further up from a git worktree).
PEERS_DIR = Path(os.environ.get("PEERS_DIR") or (next(
    (p for p in (ROOT.parent / "shared", ROOT.parent.parent / "shared") if p.is_dir()),
    ROOT.parent / "shared") / "bench" / "peers"))


def run_side_by_side(reps: int, conc_reps: int, out_dir: Path) -> str:
    env = dict(os.environ, REPS=str(reps), CONC_REPS=str(conc_reps), OUT_DIR=str(out_dir),
               HG_BIN=str(ROOT / ".venv" / "bin" / "harness-gym"))
    subprocess.run(["bash", str(PEERS_DIR / "run_with_harness_gym.sh")], cwd=ROOT, env=env,
                   check=True, stdout=sys.stderr)
    return (out_dir / "table.txt").read_text() + overhead_by_turn(out_dir / "results.json")


def overhead_by_turn(results: Path) -> str:
    """Each target's paired overhead at turns 1, 2, 15 and the last (medians over reps): is
    the cost flat in the conversation's length?"""
    raw = json.loads(results.read_text())["raw_sequential_s"]
    direct = raw["direct"]
    lines = ["", "Overhead by turn (ms, paired with 'direct', median over reps):"]
    for target, reps in raw.items():
        if target == "direct":
            continue

        def at(turn: int, reps: list[list[float]] = reps) -> float:
            return 1e3 * statistics.median(
                rep[turn] - base[turn] for rep, base in zip(reps, direct) if len(rep) > turn)

        last = min(len(rep) for rep in reps) - 1
        lines.append(f"  {target:14s} turn 1 {at(0):6.2f}  turn 2 {at(1):6.2f}  turn 15 "
                     f"{at(14):6.2f}  turn {last + 1} {at(last):6.2f}  (last/turn 1 "
                     f"{at(last) / at(0):.2f}, last/turn 2 {at(last) / at(1):.2f})")
    return "\n".join(lines) + "\n"


# --- the hop alone ------------------------------------------------------------------------------


def conversation_prompts(tokenizer, turns: int, reply: list[int], seed: int) -> list[list[int]]:
    """Prompt ids per turn, growing as the workload's do: the first rendered with the chat
    template, each later one the previous prompt + the answer + a rendered tool result."""
    sys.path.insert(0, str(PEERS_DIR))
    import workload  # the shared driver's content: same tools, system prompt, tool results

    messages = [{"role": "system", "content": workload.SYSTEM},
                {"role": "user", "content": workload.USER_TASK}]
    prompt = tokenizer.apply_chat_template(messages, tools=workload.TOOLS,
                                           add_generation_prompt=True, return_dict=False)
    prompts = [list(prompt)]
    for turn in range(1, turns):
        result = workload.tool_result(seed, turn)
        tail = tokenizer.encode(
            "\n<|im_start|>user\n<tool_response>\n" + result
            + "\n</tool_response><|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
        prompts.append(prompts[-1] + reply + tail)
    return prompts


async def hop(engine_url: str, tokenizer_dir: str, turns: int, reps: int) -> dict[str, float]:
    from harness_gym.engines import RequestContext, SamplingParams
    from harness_gym.engines.vllm import VLLMEngine

    engine = VLLMEngine([engine_url], tokenizer=tokenizer_dir, verify_logprobs="off")
    sampling = SamplingParams(max_tokens=256, temperature=1.0)

    async def call(ids: list[int], key: str) -> list[int]:
        out = []
        async for chunk in engine.stream(ids, sampling, RequestContext(routing_key=key)):
            out += chunk.token_ids
        return out

    reply = await call(engine.tokenizer.encode("hi"), "probe")
    latencies: list[list[float]] = [[] for _ in range(turns)]
    cpu = 0.0
    for rep in range(reps):
        prompts = conversation_prompts(engine.tokenizer, turns, reply, rep)
        for turn, ids in enumerate(prompts):
            wall, used = time.perf_counter(), time.process_time()
            await call(ids, f"conversation-{rep}")
            cpu += time.process_time() - used
            latencies[turn].append(time.perf_counter() - wall)
    engine.close()
    flat = sorted(x for per_turn in latencies for x in per_turn)
    return {
        "p50": statistics.median(flat) * 1e3,
        "p90": flat[int(0.9 * (len(flat) - 1))] * 1e3,
        "t1": statistics.median(latencies[0]) * 1e3,
        "t30": statistics.median(latencies[-1]) * 1e3,
        "cpu": cpu / len(flat) * 1e3,
        "prompt_tokens_t30": len(prompts[-1]),
    }


def measure_hop(turns: int, reps: int, chunk_tokens: int) -> dict[str, float]:
    from harness_gym.engines.tiny import tiny_model_dir

    tokenizer_dir = str(tiny_model_dir())
    env = dict(os.environ, FAKE_HF_TOKENIZER=tokenizer_dir, FAKE_HF_PYTHON=sys.executable)
    engine = subprocess.Popen(
        [sys.executable, str(PEERS_DIR / "fake_engine.py"), "--port", "0",
         "--chunk-tokens", str(chunk_tokens)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert engine.stdout is not None
        line = engine.stdout.readline()
        if not line.startswith("LISTENING"):
            raise RuntimeError(f"the fake engine did not start: {line!r}")
        url = f"http://127.0.0.1:{line.split()[1]}"
        return asyncio.run(hop(url, tokenizer_dir, turns, reps))
    finally:
        engine.terminate()
        engine.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=10, help="sequential reps (30 turns each)")
    parser.add_argument("--conc-reps", type=int, default=3, help="16-concurrent reps")
    parser.add_argument("--hop-reps", type=int, default=10, help="conversations for the hop")
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--out-dir", type=Path, default=Path(f"/tmp/proxy_vs_peers.{os.getpid()}"))
    parser.add_argument("--skip-peers", action="store_true", help="only measure the hop")
    args = parser.parse_args()
    if not (PEERS_DIR / "run_with_harness_gym.sh").is_file():
        print(f"skipped: no peers harness at {PEERS_DIR} (a shared/bench/peers folder beside the "
              "checkout, or set PEERS_DIR); it holds the peers, the fake engine and the workload",
              file=sys.stderr)
        return
    load_before = os.getloadavg()
    table = "" if args.skip_peers else run_side_by_side(args.reps, args.conc_reps, args.out_dir)
    found = measure_hop(args.turns, args.hop_reps, int(os.environ.get("CHUNK_TOKENS", "64")))
    load_after = os.getloadavg()
    print(table)
    print(f"vLLM hop alone (VLLMEngine -> fake engine, no proxy; {args.hop_reps} x {args.turns} "
          f"turns, {found['prompt_tokens_t30']} prompt tokens at turn {args.turns}):")
    print(f"  latency p50 {found['p50']:.2f} ms, p90 {found['p90']:.2f} ms, turn 1 "
          f"{found['t1']:.2f} ms, turn {args.turns} {found['t30']:.2f} ms; "
          f"client CPU per call {found['cpu']:.2f} ms")
    print(f"load average (1 min) before / after: {load_before[0]:.1f} / {load_after[0]:.1f} "
          f"on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
