"""One LoRA adapter per node against one shared adapter, on a two-node agent at the same budget.

The agent (``work`` -> ``answer``): the first node works the question out in a few words, the
second reads that work and replies with the number only; the two nodes do different jobs, which
is where an adapter each should pay. The task is reasoning-gym's ``chain_sum`` with two one-digit
terms, split as ``bench/rl_gain.py`` splits it (40 held-out questions never trained on), scored
by reasoning-gym's own scorer on the answer node's last number. Each arm trains the embedded
SmolLM2-135M-Instruct (bfloat16, LoRA r=16) through ``RLPhase`` exactly as ``evoagent run`` does:
``--steps`` GRPO steps of 8 inputs x 8 samples, the same rollouts for both arms (so the same
model calls and tokens, reported), ``rl.adapters: shared`` or ``per_node``. Greedy held-out
accuracy before and after; three seeds (the RL seed: adapter init, input draws, sampling), each
arm in its own process. Per arm the mean gain over seeds with a 95% t-interval, and the paired
per-seed difference per_node - shared.

    python bench/node_adapters.py [--steps 8] [--seeds 0,1,2]

Finished runs are kept in ``bench/results/node_adapters.partial.jsonl`` until the results are
written, so an interrupted run started again goes on where it stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any

import numpy as np
from results_io import RESULTS, run_kept, write_results
from rl_gain import chain_sum_split
from search_compare import mean_ci

MARK = "NODE-ADAPTERS "
ARMS = ("shared", "per_node")
PARTIAL = RESULTS / "node_adapters.partial.jsonl"  # finished runs of an unfinished benchmark
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def two_node_agent() -> Any:
    from evoagent.graph.model import AgentGraph, Edge, LLMNode

    return AgentGraph(name="work_answer", entry="work", exit="answer", nodes=(
        LLMNode(id="work", system="Work the question out in one short sentence.", max_tokens=40),
        LLMNode(id="answer", system="Reply with the final answer only: one number.",
                template="Question: {input}\nWork: {work}", max_tokens=16),
    ), edges=(Edge(src="work", dst="answer"),))


def arm(adapters: str, seed: int, steps: int) -> dict[str, Any]:
    """Train one arm on a fresh model; greedy held-out accuracy before and after."""
    import tempfile

    import torch

    from evoagent.execute.evaluate import rollout
    from evoagent.execute.executor import ExecContext
    from evoagent.llm.hf import HFBackend
    from evoagent.rl.config import RLConfig
    from evoagent.rl.phase import RLPhase
    from evoagent.spec.config import BackendConfig, RewardConfig
    from evoagent.tools import ToolContext

    torch.manual_seed(seed)
    held, train = chain_sum_split()
    graph = two_node_agent()
    backend = HFBackend(BackendConfig(dtype="bfloat16", max_batch=64, cache=False))
    ctx = ExecContext(backend, ToolContext(), seed=seed, node_adapters=adapters == "per_node")
    reward = RewardConfig(kind="reasoning_gym", extract="last_number")
    cfg = RLConfig(enabled=True, algorithm="grpo", group_size=8, inputs_per_step=8, steps=steps,
                   lr=1e-4, max_completion_tokens=48, temperature=1.0, adapters=adapters)

    spent: list[tuple[int, int]] = []  # the backend's (calls, tokens) around the training

    async def experiment() -> tuple[list[float], Any, list[float]]:
        before = [t.reward or 0.0 for t in await rollout([(graph, ex, 0) for ex in held], ctx, reward)]
        spent.append((backend.usage.calls, backend.usage.tokens))
        with tempfile.TemporaryDirectory() as run_dir:
            res = await RLPhase(cfg, backend, ctx, reward, run_dir, seed=seed).train([graph], train, generation=1)
        spent.append((backend.usage.calls, backend.usage.tokens))
        backend.weights_version = 1
        after = [t.reward or 0.0 for t in await rollout([(graph, ex, 0) for ex in held], ctx, reward)]
        return before, res, after

    t0 = time.perf_counter()
    before, res, after = asyncio.run(experiment())
    return {
        "adapters": adapters, "seed": seed, "steps": steps, "steps_trained": res.metrics["steps_trained"],
        "rollouts": len(res.rollouts), "calls": spent[1][0] - spent[0][0], "tokens": spent[1][1] - spent[0][1],
        "train_reward_per_step": [round(s["reward_mean"], 4) for s in res.metrics["per_step"]],
        "before": float(np.mean(before)), "after": float(np.mean(after)), "held_out": len(held),
        "wall_s": round(time.perf_counter() - t0, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--one", nargs=2, metavar=("ADAPTERS", "SEED"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(MARK + json.dumps(arm(args.one[0], int(args.one[1]), args.steps)), flush=True)
        return
    seeds = [int(s) for s in args.seeds.split(",")]
    start = time.perf_counter()
    runs: dict[str, list[dict[str, Any]]] = {a: [] for a in ARMS}
    for seed in seeds:
        for a in ARMS:
            cmd = [sys.executable, __file__, "--one", a, str(seed), "--steps", str(args.steps)]
            key = {"adapters": a, "seed": seed, "steps": args.steps}
            runs[a].append(run_kept(cmd, MARK, f"{a} / seed {seed}", key, PARTIAL, tail=600))
    arms = {}
    for a, rs in runs.items():
        gain, gain_ci = mean_ci([r["after"] - r["before"] for r in rs])
        after, after_ci = mean_ci([r["after"] for r in rs])
        arms[a] = {"after": round(after, 4), "after_ci": after_ci, "gain": round(gain, 4), "gain_ci": gain_ci,
                   "calls": float(np.mean([r["calls"] for r in rs])),
                   "tokens": float(np.mean([r["tokens"] for r in rs])), "runs": rs}
    diff, diff_ci = mean_ci([p["after"] - s["after"] for p, s in zip(runs["per_node"], runs["shared"], strict=True)])
    figures = {"task": "chain_sum (2 one-digit terms), agent work -> answer", "steps": args.steps,
               "seeds": seeds, "machine": f"{os.cpu_count()} cores",
               "wall_s": round(time.perf_counter() - start, 1), "arms": arms,
               "per_node_minus_shared": {"after": round(diff, 4), "ci": diff_ci}}
    write_results("node_adapters", figures)
    PARTIAL.unlink(missing_ok=True)
    print(f"before {runs['shared'][0]['before']:.3f} (both arms, greedy, {runs['shared'][0]['held_out']} held-out)")
    for a, f in arms.items():
        print(f"{a:9s} after {f['after']:.3f} {f['after_ci']}  gain {f['gain']:+.3f} {f['gain_ci']}  "
              f"calls {f['calls']:.0f} tokens {f['tokens']:.0f}")
    print(f"per_node - shared: {diff:+.3f} {diff_ci}")


if __name__ == "__main__":
    main()
