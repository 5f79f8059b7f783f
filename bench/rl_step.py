"""One GRPO optimizer step of evoagent against TRL's GRPOTrainer, same everything, one run.

Both sides: SmolLM2-135M-Instruct from the embedded HF folder in bfloat16 (TRL's fastest CPU
setting in shared/facts/stack.md), the same 4 prompts (reasoning-gym ``chain_sum``, one-digit
terms) x 4 samples at temperature 1, at most 32 completion tokens, LoRA r=8 / alpha=16 on the
same projections, lr 1e-5, gradient checkpointing, reward 1 when the last number is right.
evoagent's step is ``RLPhase.train`` (rollouts through the executor and the batched hf
backend, group advantages, ``Trainer.train_step``); TRL's is ``GRPOTrainer.train`` with
``max_steps``. Each side runs in its own process (peak RSS is per process); after one warm-up
step, ``--steps`` steps are timed. Throughput counts completion tokens per second of step time.

The pair runs ``--repeats`` times (this machine is noisy), alternating which side goes first;
prints each repeat's throughput
ratio (evoagent / TRL; goal: median >= 1.5) and peak-RSS ratio (goal <= 1.0), and writes
``bench/results/rl_step.json``: every ratio (``throughput_ratios``, ``peak_rss_ratios``) and
their medians (``throughput_ratio``, ``peak_rss_ratio``), the claims.

    python bench/rl_step.py [--steps 3] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from results_io import write_results  # bench/ is sys.path[0] when a script runs

ROOT = Path(__file__).resolve().parents[1]
PROMPTS, GROUP, MAX_TOKENS, RANK, ALPHA, LR = 4, 4, 32, 8, 16, 1e-5
SETTLE_S = 10


def examples() -> list[tuple[str, str]]:
    import reasoning_gym as rg

    data = rg.create_dataset("chain_sum", seed=3, size=PROMPTS, min_terms=2, max_terms=2, max_digits=1)
    return [(e["question"], str(e["answer"])) for e in data]


def last_number_right(text: str, answer: str) -> float:
    import re

    nums = re.findall(r"-?\d+", text)
    return float(bool(nums) and nums[-1] == answer)


def run_evoagent(steps: int) -> dict[str, float]:
    from evoagent.execute.executor import ExecContext
    from evoagent.graph.model import AgentGraph, LLMNode
    from evoagent.llm.hf import HFBackend
    from evoagent.rl.config import RLConfig
    from evoagent.rl.phase import RLPhase
    from evoagent.spec.config import BackendConfig, RewardConfig
    from evoagent.tasks.datasets import Example
    from evoagent.tools import ToolContext

    backend = HFBackend(BackendConfig(dtype="bfloat16", max_batch=64, cache=False))
    graph = AgentGraph(entry="a", exit="a", nodes=(LLMNode(id="a", max_tokens=MAX_TOKENS),))
    cfg = RLConfig(enabled=True, group_size=GROUP, inputs_per_step=PROMPTS, steps=1, lr=LR,
                   lora_rank=RANK, lora_alpha=ALPHA, max_completion_tokens=MAX_TOKENS,
                   dynamic_sampling=False, temperature=1.0)
    train = [Example(str(i), q, a) for i, (q, a) in enumerate(examples())]
    rl = RLPhase(cfg, backend, ExecContext(backend, ToolContext(), seed=0),
                 RewardConfig(kind="numeric", extract="last_number"), Path(os.environ["BENCH_TMP"]), seed=0)
    tokens = seconds = 0.0
    for step in range(steps + 1):  # step 0 warms up
        t0 = time.perf_counter()
        metrics = asyncio.run(rl.train([graph], train, generation=step)).metrics
        if step:
            seconds += time.perf_counter() - t0
            tokens += sum(s.get("tokens", 0.0) for s in metrics["per_step"])
    return {"tokens": tokens, "seconds": seconds}


def run_trl(steps: int) -> dict[str, float]:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from evoagent.llm.embedded import EMBEDDED_NAME, model_folder
    from evoagent.rl.policy import LORA_TARGETS

    folder = model_folder(EMBEDDED_NAME)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    tok = AutoTokenizer.from_pretrained(folder)
    rows = [{"prompt": [{"role": "user", "content": q}], "answer": a} for q, a in examples()]

    def reward(completions, answer, **_):
        return [last_number_right(c[0]["content"], a) for c, a in zip(completions, answer)]

    times: list[float] = []
    lengths: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - self.t0)

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                lengths.append(logs["completions/mean_length"])

    args = GRPOConfig(
        output_dir=os.environ["BENCH_TMP"], use_cpu=True, bf16=True, max_steps=steps + 1,
        per_device_train_batch_size=PROMPTS * GROUP, num_generations=GROUP,
        max_completion_length=MAX_TOKENS, learning_rate=LR, temperature=1.0, logging_steps=1,
        report_to="none", save_strategy="no", gradient_checkpointing=True, seed=0,
    )
    trainer = GRPOTrainer(
        model=model, processing_class=tok, reward_funcs=[reward], args=args,
        train_dataset=Dataset.from_list(rows * (steps + 1)), callbacks=[Clock()],
        peft_config=LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0,
                               target_modules=list(LORA_TARGETS), task_type="CAUSAL_LM"),
    )
    trainer.train()
    timed = times[1:]  # step 0 warms up
    return {"tokens": sum(lengths[1 : len(timed) + 1]) * PROMPTS * GROUP, "seconds": sum(timed)}


def worker(side: str, steps: int) -> None:
    import torch

    torch.manual_seed(0)
    out = {"evoagent": run_evoagent, "trl": run_trl}[side](steps)
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps(out), flush=True)


def run_side(side: str, steps: int) -> dict[str, float]:
    """One side's timed steps in a fresh process (peak RSS is per process)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "BENCH_TMP": tmp, "HF_HUB_OFFLINE": "1"}
        proc = subprocess.run([sys.executable, __file__, "--worker", side, "--steps", str(steps)],
                              capture_output=True, text=True, env=env, check=False)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        sys.exit(f"{side} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    r = json.loads(line.removeprefix("RESULT "))
    r["tokens_per_s"] = r["tokens"] / r["seconds"]
    print(f"{side:>8}: {r['tokens']:.0f} completion tokens in {r['seconds']:.1f} s over {steps} steps "
          f"= {r['tokens_per_s']:.1f} tok/s, peak RSS {r['peak_rss_mb']:.0f} MB", flush=True)
    return r


def main(steps: int, repeats: int) -> None:
    """Run the (TRL, evoagent) pair ``repeats`` times; claim the medians of the ratios."""
    figures: dict[str, object] = {"prompts": PROMPTS, "group": GROUP, "max_tokens": MAX_TOKENS,
                                  "lora_rank": RANK, "steps_timed": steps, "repeats": []}
    throughput, rss = [], []
    for i in range(repeats):
        # Alternate who goes first and let the machine settle in between: the process after a
        # large one that just exited runs slower here while the kernel reclaims its memory.
        order = ("trl", "evoagent") if i % 2 == 0 else ("evoagent", "trl")
        pair = {}
        for side in order:
            time.sleep(SETTLE_S)
            pair[side] = run_side(side, steps)
        evo, trl = pair["evoagent"], pair["trl"]
        throughput.append(round(evo["tokens_per_s"] / trl["tokens_per_s"], 3))
        rss.append(round(evo["peak_rss_mb"] / trl["peak_rss_mb"], 3))
        figures["repeats"].append(pair)  # type: ignore[attr-defined]
        print(f"repeat {i + 1}: throughput {throughput[-1]:.2f}x, peak RSS {rss[-1]:.2f}x", flush=True)
    figures["throughput_ratios"] = throughput
    figures["peak_rss_ratios"] = rss
    figures["throughput_ratio"] = statistics.median(throughput)
    figures["peak_rss_ratio"] = statistics.median(rss)
    print(f"throughput ratio evoagent/TRL: median {figures['throughput_ratio']:.2f}x of {throughput} "
          f"(goal >= 1.5); peak RSS ratio: median {figures['peak_rss_ratio']:.2f}x of {rss} "
          "(goal <= 1.0)")
    write_results("rl_step", figures)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--worker", choices=["evoagent", "trl"])
    a = ap.parse_args()
    worker(a.worker, a.steps) if a.worker else main(a.steps, a.repeats)
