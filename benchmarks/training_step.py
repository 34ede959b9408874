"""What one SFT/GRPO row costs on this machine: full-sequence backward vs a frozen prompt prefix.

    python benchmarks/training_step.py --traces DIR [--model smollm2] [--rows 2] [--threads 1]

Takes real agent segments (passing episodes from RecordTraces files, e.g. the learning curve's
demos) and times, per row, a forward+backward (the AdamW step, once per batch, on its own):

- `full`: the whole row with gradient (what plain SFT and TRL's GRPO do);
- `frozen_cold`: the prompt without gradient, then the rest with it (`FrozenPrefixScorer`);
- `frozen_shared`: the same for a second row whose prompt shares a prefix with the first,
  under the same weights (rows of one batch, a GRPO group): only the unshared part is run.

Plus two references with known quiet figures on 2 idle cores (SmolLM2-135M, fp32):
a full step over 1,024 tokens (8 s) and a 2,500-token prefill (6 s), so times measured on a
loaded machine can be scaled. Wall and CPU seconds are both reported; results go to
`--out` (default benchmarks/results/training_step.json).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch

RESULTS = Path(__file__).resolve().parent / "results"
QUIET = {"full_1024_s": 8.0, "prefill_2500_s": 6.0}  # issue 16, measured on 2 idle cores


def timed(fn: Any) -> dict[str, float]:
    wall, cpu = time.monotonic(), time.process_time()
    fn()
    return {"wall_s": time.monotonic() - wall, "cpu_s": time.process_time() - cpu}


def main() -> None:
    from transformers import AutoModelForCausalLM

    from harness_gym.training.sft import IGNORE_INDEX, sft_rows
    from harness_gym.training import FrozenPrefixScorer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, required=True)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--rows", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, default=RESULTS / "training_step.json")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.model == "smollm2":
        from harness_gym.engines.smollm2 import smollm2_model_dir

        directory = smollm2_model_dir()
    else:
        directory = Path(args.model)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    rows = sft_rows(args.traces)[: args.rows]
    if len(rows) < 2:
        raise SystemExit("need two passing agent segments in --traces")

    def start_of(row: dict[str, Any]) -> int:
        return next(i for i, label in enumerate(row["labels"]) if label != IGNORE_INDEX)

    def optimizer_step() -> None:
        optimizer.step()
        optimizer.zero_grad()

    def full(row: dict[str, Any]) -> None:
        ids = torch.tensor([row["input_ids"]])
        labels = torch.tensor(row["labels"][1:])
        logits = model(input_ids=ids).logits[0, :-1]
        torch.nn.functional.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX).backward()

    scorer = FrozenPrefixScorer(model)

    def frozen(row: dict[str, Any]) -> None:
        start = start_of(row)
        logps, _ = scorer.token_logprobs(row["input_ids"], start)
        keep = torch.tensor(row["labels"][start:]) != IGNORE_INDEX
        (-logps[keep].mean()).backward()

    a, b = rows[0], rows[1]
    shared = next((i for i, (x, y) in enumerate(zip(a["input_ids"], b["input_ids"],
                                                     strict=False)) if x != y), 0)
    report: dict[str, Any] = {
        "model": str(directory), "threads": torch.get_num_threads(),
        "load_avg_start": list(os.getloadavg()),
        "row_tokens": len(a["input_ids"]), "row_prompt_tokens": start_of(a),
        "row_loss_tokens": sum(label != IGNORE_INDEX for label in a["labels"]),
        "shared_prefix_tokens": shared,
    }
    # forward+backward per row; the optimizer step once per batch, timed on its own
    report["full"] = timed(lambda: full(a))
    report["optimizer_step"] = timed(optimizer_step)
    report["frozen_cold"] = timed(lambda: frozen(a))
    report["frozen_shared"] = timed(lambda: frozen(b))  # same weights: a's prefix is reused
    optimizer_step()
    ids = torch.randint(100, 40000, (1, 2500))

    def reference() -> None:
        model(input_ids=ids[:, :1024]).logits.mean().backward()
        optimizer_step()

    report["full_1024"] = timed(reference)
    with torch.no_grad():
        report["prefill_2500"] = timed(lambda: model(input_ids=ids, logits_to_keep=1))
    report["load_avg_end"] = list(os.getloadavg())
    # How much slower than quiet this run was, by each reference (wall and CPU).
    report["slowdown"] = {
        f"{name}_{kind}": report[name][f"{kind}_s"] / QUIET[f"{name}_s"]
        for name in ("full_1024", "prefill_2500") for kind in ("wall", "cpu")}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
