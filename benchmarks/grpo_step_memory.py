"""A GRPO step's peak memory on this CPU: how `FrozenPrefixGRPOTrainer` and the learning curve
train a group, against how they did before the full run's OOM kill.

    python benchmarks/grpo_step_memory.py            # SmolLM2 + the SFT adapter, ~4 min
    python benchmarks/grpo_step_memory.py --quick    # the tiny model, made-up rows (the test)

The rows are a real GRPO group: by default the full learning run's `grpo-flat` step 15 (its
journal, committed in the run's state), whose longest row has a 2,626-token completion of which
634 tokens were sampled (11 tool calls); the kernel's OOM killer ended that step's training at
18.2 GB. The model is SmolLM2-135M with the run's SFT adapter (LoRA, trainable), in training
mode. Each way of training the group runs in a process of its own (its peak resident memory is
that process's `ru_maxrss`, in GiB), scoring each row's completion at the group's sampling
(temperature 0.8, top-p 0.95, top-k 50, entropy on, as TRL asks) and backpropagating a loss
over the sampled tokens:

- `every_position_one_pass`: before: logits at every completion position, the rows' losses
  summed, one backward (one pass over the group);
- `sampled_one_pass`: logits only where the model sampled (`token_logprobs(scored=...)`);
- `sampled_recomputed_row_by_row`: now: that, each layer's MLP recomputed in the backward pass,
  and one backward per row (the learning curve's one row a pass).

The loss is the same in each (checked); wall times are reported but the machine may be shared.
Writes benchmarks/results/grpo_step_memory.json (with `--quick`, only where `--out` says).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
STATE = RESULTS / "learning_curve_state" / "full"
ROWS = STATE / "grpo-flat" / "rollouts" / "step-00015-group-0.json.gz"
ADAPTER = STATE / "sft" / "model"
SAMPLING = {"temperature": 0.8, "top_p": 0.95, "top_k": 50}
VARIANTS = {  # name: (score only sampled positions, recompute MLPs, one backward per row)
    "every_position_one_pass": (False, False, False),
    "sampled_one_pass": (True, False, False),
    "sampled_recomputed_row_by_row": (True, True, True),
}


def quick_rows() -> dict[str, list[Any]]:
    """Four made-up rows for the tiny model: a shared prompt, completions with tool output."""
    import torch

    ids = torch.randint(5, 3000, (600,), generator=torch.Generator().manual_seed(0)).tolist()
    prompt, lengths = ids[:80], (60, 90, 240, 50)
    masks = [[0 if 20 <= i < n - 20 else 1 for i in range(n)] for n in lengths]
    return {"prompt_ids": [prompt] * 4, "completion_ids": [ids[80:80 + n] for n in lengths],
            "env_mask": masks}


def load_rows(path: Path | None) -> dict[str, list[Any]]:
    if path is None:
        return quick_rows()
    return json.loads(gzip.decompress(path.read_bytes()))["rows"]


def readable_adapter(adapter: Path, scratch: Path) -> Path:
    """`adapter` as peft reads it: the run's state keeps its JSON files gzip-compressed
    (`curve.state`), so those are written out plain into `scratch` beside the weights."""
    if (adapter / "adapter_config.json").exists():
        return adapter
    for path in adapter.iterdir():
        if path.name.endswith(".json.gz"):
            (scratch / path.name[:-3]).write_bytes(gzip.decompress(path.read_bytes()))
        else:
            (scratch / path.name).symlink_to(path.resolve())
    return scratch


def load_model(quick: bool, adapter: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    if quick:
        from harness_gym.engines.tiny import tiny_model_dir

        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir(), dtype=torch.float32)
    else:
        from harness_gym.engines.smollm2 import smollm2_model_dir
        from harness_gym.training.lora import load_adapter

        base = AutoModelForCausalLM.from_pretrained(smollm2_model_dir(), dtype=torch.float32)
        with tempfile.TemporaryDirectory() as plain:
            model = load_adapter(base, readable_adapter(adapter, Path(plain)), trainable=True)
    return model.train()


def run_variant(name: str, quick: bool, rows_path: Path | None, adapter: Path) -> dict[str, Any]:
    """One way of training the group, in this process (a child of `main`)."""
    import torch

    from harness_gym.training import FrozenPrefixScorer

    sampled_only, recompute, row_by_row = VARIANTS[name]
    rows = load_rows(rows_path)
    model = load_model(quick, adapter)
    loaded_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
    scorer = FrozenPrefixScorer(model, recompute_mlps=recompute)
    started, total, pending = time.monotonic(), 0.0, []
    for prompt, completion, mask in zip(rows["prompt_ids"], rows["completion_ids"],
                                        rows["env_mask"], strict=True):
        sampled = torch.tensor(mask, dtype=torch.bool)
        logps, _ = scorer.token_logprobs(prompt + completion, len(prompt), entropy=True,
                                         scored=sampled if sampled_only else None, **SAMPLING)
        # tool output carries no loss; a token outside the sampler's set (-inf) adds nothing,
        # as in the trainer
        loss = torch.where(sampled & logps.isfinite(), logps, 0.0).sum() / sampled.sum()
        if row_by_row:
            loss.backward()
            total += float(loss)
        else:
            pending.append(loss)
    if pending:
        summed = torch.stack(pending).sum()
        summed.backward()
        total = float(summed)
    return {"peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
            "model_loaded_rss_gib": loaded_gib, "wall_s": time.monotonic() - started,
            "loss": total}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rows", type=Path, default=ROWS, help="a GRPO journal group file")
    parser.add_argument("--adapter", type=Path, default=ADAPTER)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--variant", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    rows_path = None if args.quick else args.rows
    if args.variant:
        print(json.dumps(run_variant(args.variant, args.quick, rows_path, args.adapter)))
        return
    rows = load_rows(rows_path)
    measured = {}
    for name in VARIANTS:
        argv = [sys.executable, __file__, "--variant", name, "--rows", str(args.rows),
                "--adapter", str(args.adapter), *(["--quick"] if args.quick else [])]
        done = subprocess.run(argv, capture_output=True, text=True, check=False,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
        if done.returncode != 0:
            raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
        measured[name] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{name}: peak {measured[name]['peak_rss_gib']:.2f} GiB, "
              f"{measured[name]['wall_s']:.1f} s", flush=True)
    losses = [m["loss"] for m in measured.values()]
    if not all(math.isclose(x, losses[0], rel_tol=1e-4, abs_tol=1e-6) for x in losses):
        raise SystemExit(f"the variants' losses differ: {losses}")
    before, now = (measured[k]["peak_rss_gib"] for k in ("every_position_one_pass",
                                                          "sampled_recomputed_row_by_row"))
    results = {
        "mode": "quick" if args.quick else "full",
        "rows": None if args.quick else str(args.rows.relative_to(REPO)),
        "completion_tokens": [len(c) for c in rows["completion_ids"]],
        "sampled_tokens": [sum(m) for m in rows["env_mask"]],
        "sampling": SAMPLING, "cores": os.cpu_count(), "variants": measured,
        "peak_ratio_now_vs_before": round(now / before, 3),
        "load_average_at_end": os.getloadavg()[0],
    }
    print(f"peak now / before: {results['peak_ratio_now_vs_before']:.2f}x")
    out = args.out or (None if args.quick else RESULTS / "grpo_step_memory.json")
    if out is not None:
        out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
