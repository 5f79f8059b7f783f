"""Does serving grouped-query attention without expanding the K/V heads pay, and change nothing?

The hf backend attends through ``evoagent.llm.attention.gqa_sdpa``: on CPU, a masked
grouped-query call reads the model's K/V heads as they are, where transformers' ``sdpa``
copies them once per query head first (``repeat_kv``). Each repeat evaluates
``bench/backend_throughput.py``'s workload (one llm node, a system prompt and three demos,
greedy, at most 48 tokens, ``--inputs`` word problems) on the embedded model with the
backend's attention and with transformers' ``sdpa``, in alternating order, per dtype; the
ratio is ours / sdpa in completion tokens per second, and the completions must be the same
(token counts and scores equal; ``tests/llm/test_attention.py`` checks tokens and logprobs
exactly). The medians are the claims. Writes ``bench/results/attention_speed.json``.

    python bench/attention_speed.py [--repeats 3] [--inputs 64] [--dtypes bfloat16,float32]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics

from backend_throughput import ROOT, fresh_eval  # bench/ is sys.path[0] when a script runs
from results_io import write_results

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def one_arm(dtype: str, attention: str, inputs: int) -> dict[str, float]:
    """The workload's throughput attending with ``attention``: ``ours`` (the backend's own) or
    ``sdpa`` (transformers')."""
    _, got = fresh_eval(dtype, inputs, "sdpa" if attention == "sdpa" else "")
    return {"tok_s": round(got["tok_s"], 2), "tokens": got["tokens"], "score": got["score"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--inputs", type=int, default=64)
    ap.add_argument("--dtypes", default="bfloat16,float32")
    args = ap.parse_args()
    dtypes = [d for d in args.dtypes.split(",") if d]
    repeats, medians = [], {}
    for r in range(args.repeats):
        row = {}
        for dtype in dtypes:
            order = ("ours", "sdpa") if r % 2 == 0 else ("sdpa", "ours")
            arms = {arm: one_arm(dtype, arm, args.inputs) for arm in order}
            if (arms["ours"]["tokens"], arms["ours"]["score"]) != (arms["sdpa"]["tokens"], arms["sdpa"]["score"]):
                raise SystemExit(f"{dtype}: the two attentions gave different completions: {arms}")
            ratio = round(arms["ours"]["tok_s"] / arms["sdpa"]["tok_s"], 3)
            row[dtype] = {**arms, "ratio": ratio}
            print(f"repeat {r + 1} {dtype}: ours/sdpa {ratio}x ({arms['ours']['tok_s']} vs "
                  f"{arms['sdpa']['tok_s']} tok/s)", flush=True)
        repeats.append(row)
    for dtype in dtypes:
        medians[dtype] = statistics.median(r[dtype]["ratio"] for r in repeats)
        print(f"median ours/sdpa, {dtype}: {medians[dtype]}x")
    write_results("attention_speed", {
        "workload": f"executor on {args.inputs} word problems (1 llm node, 3 demos, greedy, <= 48 tokens), "
                    "max_batch 64, no completion cache",
        "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores",
        "repeats": repeats, "ours_over_sdpa": medians,
    }, inputs=(ROOT / "examples" / "arithmetic",))


if __name__ == "__main__":
    main()
