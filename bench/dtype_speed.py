"""Which weight dtype is faster on this machine, and does ``policy.dtype: auto`` pick it?

bfloat16 halves the bytes each matmul reads, but a CPU without AVX512-BF16 or AMX has no bf16
arithmetic and torch emulates it. Each repeat loads the embedded model in float32 and in
bfloat16, back to back, and measures:

- ``generate``: the executor evaluating ``bench/backend_throughput.py``'s workload (one llm
  node, a system prompt and three demos, greedy, at most 48 tokens) on ``--inputs`` word
  problems, completion tokens per second;
- ``train``: one forward and backward pass of the LoRA-wrapped training copy (rank 16, what an
  RL phase trains) over 2 rows of 64 tokens through ``rl.policy.token_logprobs`` (the
  trainer's own log-probability path), seconds.

Ratios per repeat are float32 / bfloat16 (throughput for ``generate``, speed for ``train``);
the medians are the claims, with what ``auto`` resolves to here and the ratio of auto's pick
to bfloat16 (the old default). Writes ``bench/results/dtype_speed.json``.

    python bench/dtype_speed.py [--repeats 3] [--inputs 32]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from typing import Any

from backend_throughput import ROOT, fresh_eval  # bench/ is sys.path[0] when a script runs
from results_io import write_results

os.environ.setdefault("HF_HUB_OFFLINE", "1")
TRAIN_ROWS, TRAIN_TOKENS = 2, 64


def train_seconds(model: Any, vocab: int) -> float:
    """One forward + backward of the LoRA-wrapped ``model`` on a fixed random batch."""
    import torch

    from evoagent.rl.policy import token_logprobs

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (TRAIN_ROWS, TRAIN_TOKENS), generator=g)
    mask = torch.ones_like(ids)
    t0 = time.perf_counter()
    logp = token_logprobs(model, ids, mask, temperature=1.0)
    logp.mean().backward()
    return time.perf_counter() - t0


def one_dtype(dtype: str, inputs: int) -> dict[str, float]:
    from evoagent.rl.config import RLConfig
    from evoagent.rl.policy import attach_lora

    backend, gen = fresh_eval(dtype, inputs)
    lora = attach_lora(backend.trainable_model(), RLConfig(enabled=True, lora_rank=16, lora_alpha=32)).train()
    vocab = backend.tokenizer.vocab_size  # no warm-up pass: a first pass measured no slower
    return {"gen_tok_s": round(gen["tok_s"], 2), "gen_tokens": gen["tokens"], "score": gen["score"],
            "train_s": round(train_seconds(lora, vocab), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--inputs", type=int, default=32)
    args = ap.parse_args()

    import torch

    from evoagent.llm.hardware import resolve_dtype

    auto = resolve_dtype("auto", "cpu")
    repeats = []
    for r in range(args.repeats):
        row = {dtype: one_dtype(dtype, args.inputs) for dtype in ("float32", "bfloat16")}
        row["generate_ratio"] = round(row["float32"]["gen_tok_s"] / row["bfloat16"]["gen_tok_s"], 3)
        row["train_ratio"] = round(row["bfloat16"]["train_s"] / row["float32"]["train_s"], 3)
        print(f"repeat {r + 1}: generate float32/bfloat16 {row['generate_ratio']}x "
              f"({row['float32']['gen_tok_s']} vs {row['bfloat16']['gen_tok_s']} tok/s), "
              f"train {row['train_ratio']}x ({row['float32']['train_s']} vs {row['bfloat16']['train_s']} s)",
              flush=True)
        repeats.append(row)
    gen = statistics.median(r["generate_ratio"] for r in repeats)
    train = statistics.median(r["train_ratio"] for r in repeats)
    pick = 1.0 if auto == "bfloat16" else gen
    print(f"median float32/bfloat16: generate {gen}x, train {train}x; auto picks {auto} here "
          f"(generation {pick}x the bfloat16 default's)")
    write_results("dtype_speed", {
        "workload": f"executor on {args.inputs} word problems (1 llm node, 3 demos, greedy, <= 48 "
                    f"tokens); train: LoRA r16 forward+backward, {TRAIN_ROWS}x{TRAIN_TOKENS} tokens",
        "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores",
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "auto_resolves_to": auto, "repeats": repeats,
        "generate_float32_over_bfloat16": gen, "train_float32_over_bfloat16": train,
        "auto_over_bfloat16_generate": pick,
    }, inputs=(ROOT / "examples" / "arithmetic",))


if __name__ == "__main__":
    main()
