"""Time to first streamed token vs completion length, through the proxy, in one run.

The proxy streams tokens as the engine samples them, so the time to the first token must not
grow with the length of the answer (a proxy that buffers and replays would scale linearly).
Engine: `tiny` on the CPU; client: the openai SDK, streaming; 5 calls per length, median.

    python benchmarks/streaming_ttft.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

LENGTHS = (16, 256, 2048)
MESSAGES = [{"role": "user", "content": "Write a long answer."}]


def main() -> None:
    import openai

    from harness_gym.engines import load_engine
    from harness_gym.proxy import InterceptionProxy

    engine = load_engine("tiny")
    rows = []
    with InterceptionProxy(engine) as proxy:
        for length in LENGTHS:
            session = proxy.open_session(sampling={"max_tokens": length})
            client = openai.OpenAI(base_url=proxy.base_url, api_key=session.session_id,
                                   max_retries=0)
            firsts, totals = [], []
            for seed in range(5):
                started = time.perf_counter()
                first = None
                for chunk in client.chat.completions.create(
                        model="m", messages=MESSAGES, stream=True, seed=seed):
                    if first is None and chunk.choices and chunk.choices[0].delta.content:
                        first = time.perf_counter() - started
                firsts.append(first)
                totals.append(time.perf_counter() - started)
            rows.append((length, statistics.median(firsts) * 1e3, statistics.median(totals) * 1e3))
    engine.close()
    print(f"{'max_tokens':>10} {'first token ms':>15} {'whole answer ms':>16}")
    for length, first, total in rows:
        print(f"{length:>10} {first:>15.1f} {total:>16.1f}")
    print(f"\nsummary: first-token time at {LENGTHS[-1]} tokens / at {LENGTHS[0]} tokens = "
          f"{rows[-1][1] / rows[0][1]:.2f}x while the whole answer took "
          f"{rows[-1][2] / rows[0][2]:.1f}x longer")


if __name__ == "__main__":
    main()
