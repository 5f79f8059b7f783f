"""Does the inner RL loop make SmolLM2-135M-Instruct better? Held-out scores before and after.

Two experiments, each arm in its own process on a fresh copy of the embedded model (bfloat16,
LoRA r=16), trained through ``RLPhase`` exactly as ``evoagent run`` trains it:

1. **reasoning-gym ``chain_sum``**, two one-digit terms ("Calculate 5 + 3."): the difficulty
   at which the base model answers roughly a third right when asked directly, so GRPO groups
   have variance. No partial credit: 1 when the last number of the reply is the answer
   (reasoning-gym's own scorer). LoRA lr 1e-4. The problem space is small: the 512 draws hold
   188 distinct questions, many repeated; 40 are held out (never trained on), the other 148
   train. ``--steps`` GRPO steps of 8 inputs x 8 samples, then greedy accuracy on the 40
   held-out questions, before and after, with 95% Wilson intervals and a 95% interval of the
   paired difference.
2. **textarena FrozenLake-v0-train** (4x4, seeded boards), played by ``examples/frozenlake``'s
   loop agent, reward = the game's own partial credit (share of the way to the goal; 1 = won).
   GRPO against GiGPO at the same rollout budget (``--game-steps`` steps of 4 boards x 8
   episodes each, sampled at temperature 0.7), then the mean score on 32 held-out boards of
   4 episodes each at that temperature, before and after, with 95% intervals.

Prints a markdown table and writes ``bench/results/rl_gain.json``.

    python bench/rl_gain.py [--steps 16] [--game-steps 6] [--arms chain_sum ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from code_graph import manifest  # bench/ is sys.path[0] when a script runs
from results_io import RESULTS, STARTED, write_results

ROOT = Path(__file__).resolve().parents[1]
HELD_OUT_QUESTIONS = 40  # distinct chain_sum questions never trained on; every other question trains
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def wilson(k: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a proportion k / n."""
    if n == 0:
        return 0.0, 0.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def mean_ci(xs: list[float], z: float = 1.96) -> tuple[float, float, float]:
    """Mean and its 95% normal-approximation interval (for paired differences, partial credit)."""
    n = len(xs)
    m = sum(xs) / n
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1)) if n > 1 else 0.0
    return m, m - z * sd / math.sqrt(n), m + z * sd / math.sqrt(n)


def chain_sum_split() -> tuple[list[Any], list[Any]]:
    """(held-out, train) examples of one-digit ``chain_sum`` pairs. Draws repeat questions: the
    split is by question text, so no held-out question is ever trained on (a split by index
    would share most of them)."""
    from evoagent.spec.config import DatasetConfig
    from evoagent.tasks.datasets import load_examples

    data = load_examples(
        DatasetConfig(kind="reasoning_gym", name="chain_sum", size=512,
                      options={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}),
        seed=7, base_dir=ROOT,
    )
    first: dict[str, Any] = {}
    for ex in data:
        first.setdefault(ex.input, ex)
    held = list(first.values())[:HELD_OUT_QUESTIONS]
    return held, [ex for ex in data if ex.input not in {h.input for h in held}]


def arm(kind: str, algorithm: str, steps: int) -> dict[str, Any]:
    """Train one arm on a fresh model and score the held-out split before and after."""
    import torch

    from evoagent.execute.evaluate import rollout
    from evoagent.execute.executor import ExecContext
    from evoagent.graph import load_graph
    from evoagent.graph.model import AgentGraph, LLMNode
    from evoagent.llm.hf import HFBackend
    from evoagent.rl.config import RLConfig
    from evoagent.rl.phase import RLPhase
    from evoagent.spec.config import BackendConfig, DatasetConfig, RewardConfig
    from evoagent.tasks.datasets import load_examples
    from evoagent.tools import ToolContext

    torch.manual_seed(0)
    backend = HFBackend(BackendConfig(dtype="bfloat16", max_batch=64, cache=False))
    ctx = ExecContext(backend, ToolContext(), seed=0)
    if kind == "chain_sum":
        held, train = chain_sum_split()
        graph = AgentGraph(entry="answer", exit="answer", nodes=(LLMNode(
            id="answer", system="Answer the question. Reply with the final answer only.",
            max_tokens=32),))
        reward = RewardConfig(kind="reasoning_gym", extract="last_number")
        cfg = RLConfig(enabled=True, algorithm=algorithm, group_size=8, inputs_per_step=8,
                       steps=steps, lr=1e-4, max_completion_tokens=32, temperature=1.0)
    else:
        data = load_examples(DatasetConfig(kind="textarena", name="FrozenLake-v0-train", size=96),
                             seed=7, base_dir=ROOT)
        held, train = data[:32], data[32:]
        graph = load_graph(ROOT / "examples" / "frozenlake" / "play.yaml")
        reward = RewardConfig()
        cfg = RLConfig(enabled=True, algorithm=algorithm, group_size=8, inputs_per_step=4,
                       steps=steps, lr=1e-4, max_completion_tokens=12, temperature=0.7)

    async def held_out() -> list[float]:
        """Per held-out item: greedy correctness (chain_sum), or the mean score of 4 episodes
        sampled at the training temperature (FrozenLake: greedy play makes the same move on
        nearly every board, so its score barely moves while the policy's distribution does)."""
        if kind == "chain_sum":
            trajs = await rollout([(graph, ex, 0) for ex in held], ctx, reward)
            return [t.reward or 0.0 for t in trajs]
        sampled = replace(ctx, temperature=cfg.temperature)
        trajs = await rollout([(graph, ex, 10_000 + k) for ex in held for k in range(4)], sampled,
                              reward)
        return [sum(t.reward or 0.0 for t in trajs[4 * i : 4 * i + 4]) / 4 for i in range(len(held))]

    async def experiment() -> tuple[list[float], Any, list[float]]:
        """One event loop for everything: the execution gate belongs to the loop it runs on."""
        before = await held_out()
        run_dir = RESULTS / f".rl_gain_{kind}_{algorithm}"
        res = await RLPhase(cfg, backend, ctx, reward, run_dir, seed=0).train(
            [graph], train, generation=1)
        backend.weights_version = 1
        return before, res, await held_out()

    t0 = time.perf_counter()
    before, res, after = asyncio.run(experiment())
    per_step = res.metrics["per_step"]
    return {
        "kind": kind, "algorithm": algorithm, "steps": steps,
        "rollouts": len(res.rollouts), "steps_trained": res.metrics["steps_trained"],
        "train_reward_per_step": [round(s["reward_mean"], 4) for s in per_step],
        "before": before, "after": after, "seconds": round(time.perf_counter() - t0, 1),
    }


def summarise(r: dict[str, Any]) -> dict[str, Any]:
    n = len(r["before"])
    out = {k: v for k, v in r.items() if k not in ("before", "after")}
    diff = [a - b for a, b in zip(r["after"], r["before"], strict=True)]
    d, lo, hi = mean_ci(diff)
    out.update(n_held_out=n, diff=round(d, 4), diff_ci95=[round(lo, 4), round(hi, 4)])
    for side in ("before", "after"):
        xs = r[side]
        if r["kind"] == "chain_sum":
            k = sum(xs)
            out[side] = round(k / n, 4)
            out[f"{side}_ci95"] = [round(x, 4) for x in wilson(k, n)]
        else:
            m, lo, hi = mean_ci(xs)
            out[side] = round(m, 4)
            out[f"{side}_ci95"] = [round(lo, 4), round(hi, 4)]
    return out


def run_arm(kind: str, algorithm: str, steps: int) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, __file__, "--worker", kind, algorithm, str(steps)],
        capture_output=True, text=True, cwd=ROOT,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        sys.exit(f"{kind}/{algorithm} failed:\n{proc.stderr[-3000:]}")
    return summarise(json.loads(lines[-1].removeprefix("RESULT ")))


ARMS = {"chain_sum": ("chain_sum", "grpo"), "frozenlake_grpo": ("frozenlake", "grpo"),
        "frozenlake_gigpo": ("frozenlake", "gigpo")}


def main(steps: int, game_steps: int, arms: list[str]) -> None:
    """Run ``arms``; the other arms keep their figures from the last results file, which must
    have been written by this very code (the file records one code for all its arms)."""
    inputs = (ROOT / "examples" / "frozenlake",)
    last = RESULTS / "rl_gain.json"
    old = json.loads(last.read_text()) if last.is_file() else {}
    done = {f"{r['kind']}_{r['algorithm']}".replace("chain_sum_grpo", "chain_sum"): r
            for r in old.get("arms", [])}
    if set(done) - set(arms) and old.get("code") != manifest(Path(__file__), inputs, STARTED):
        sys.exit(f"rl_gain: {', '.join(sorted(set(done) - set(arms)))} would keep figures that "
                 f"other code wrote ({last.name}); run every arm, or move the file away")
    for name in arms:
        kind, algorithm = ARMS[name]
        done[name] = run_arm(kind, algorithm, steps if kind == "chain_sum" else game_steps)
        print(json.dumps(done[name]), flush=True)
    rows = [done[name] for name in ARMS if name in done]
    print("\n| task | algorithm | rollouts | held-out before (95% CI) | after (95% CI) "
          "| paired diff (95% CI) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['kind']} | {r['algorithm']} | {r['rollouts']} "
              f"| {r['before']:.3f} [{r['before_ci95'][0]:.3f}, {r['before_ci95'][1]:.3f}] "
              f"| {r['after']:.3f} [{r['after_ci95'][0]:.3f}, {r['after_ci95'][1]:.3f}] "
              f"| {r['diff']:+.3f} [{r['diff_ci95'][0]:+.3f}, {r['diff_ci95'][1]:+.3f}] |")
    print()
    write_results("rl_gain", {"arms": rows}, inputs=inputs)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=16, help="GRPO steps on chain_sum")
    ap.add_argument("--game-steps", type=int, default=6, help="GRPO / GiGPO steps on FrozenLake")
    ap.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS),
                    help="arms to run (the others keep their last figures)")
    ap.add_argument("--worker", nargs=3, metavar=("KIND", "ALGORITHM", "STEPS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        kind, algorithm, n = args.worker
        print("RESULT " + json.dumps(arm(kind, algorithm, int(n))), flush=True)
    else:
        main(args.steps, args.game_steps, args.arms)
