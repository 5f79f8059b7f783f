"""Does a count-based exploration bonus give RL a signal where a goal is sparse?

Two textarena games that run offline, scored 1 for a win and 0 otherwise (``partial_credit:
false``): FrozenLake-v0-train (4x4, seeded boards) and GuessTheNumber-v0-train (1 to 20, ten
guesses). Each is played by a loop node of the embedded SmolLM2-135M-Instruct, one move per
reply. Per game and run seed, two arms at the same rollouts: one RL phase of ``STEPS`` GRPO
steps of 4 boards x 8 episodes (temperature 0.7, dynamic sampling on), plain (``none``) or with
``rl.exploration: {kind: count, beta: BETA}`` (``count``), trained through ``RLPhase`` exactly
as ``evoagent run`` trains it. The boards are the same for every seed; the seed draws the
rollouts and the training inputs.

Per cell (game, arm, seed): the success rate of 4 episodes per held-out board (16 boards, at the
training temperature) before and after the phase, the training episodes' success rate, and per
step the share of groups with any signal in the task's reward (``group_signal_share``) and in
the reward RL trained on (``shaped_group_signal_share``). The summary compares the arms by a
two-level bootstrap (seeds, then boards), paired by board.

Each cell is its own process and file under ``bench/results/exploration/`` (``bench/cells.py``),
so a stopped run resumes; run it from a ``git worktree`` at one commit::

    python bench/exploration.py [--results PATH]   # the missing cells, then the summary
    python bench/exploration.py --plan             # done and missing cells
    python bench/exploration.py --summarize        # exploration.json/.md from the cells, run none
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import cells
import numpy as np
from results_io import RESULTS

ROOT = Path(__file__).resolve().parents[1]
FOLDER = RESULTS / "exploration"
ARMS = ("none", "count")
SEEDS = (0, 1, 2)
STEPS = 6
BETA = 0.5  # a never-seen board's bonus: half a win
HELD_OUT, EPISODES = 16, 4  # boards, and sampled episodes per board
# game -> (textarena id, system prompt, move prompt)
GAMES = {
    "frozenlake": ("FrozenLake-v0-train",
                   "You play a grid game. Reply with exactly one move in square brackets: [up], [down], "
                   "[left] or [right].", "Your move (one of [down], [right], [up], [left]):"),
    "guess_number": ("GuessTheNumber-v0-train",
                     "You guess a secret whole number from 1 to 20. Reply with exactly one guess in square "
                     "brackets, for example [7]. Use the hints: higher or lower.", "Your guess:"),
}


def run_cell(game: str, arm: str, seed: int) -> dict[str, Any]:
    """One phase of one arm on one game at one seed, with the held-out success before and after."""
    from evoagent.execute.evaluate import rollout
    from evoagent.execute.executor import ExecContext
    from evoagent.graph.model import AgentGraph, LoopNode
    from evoagent.llm.hf import HFBackend
    from evoagent.rl.config import RLConfig
    from evoagent.rl.phase import RLPhase
    from evoagent.spec.config import BackendConfig, DatasetConfig, RewardConfig
    from evoagent.tasks.datasets import load_examples
    from evoagent.tools import ToolContext

    env_id, system, prompt = GAMES[game]
    data = load_examples(DatasetConfig(kind="textarena", name=env_id, size=48, options={"partial_credit": False}),
                         seed=7, base_dir=ROOT)
    held, train = data[:HELD_OUT], data[HELD_OUT:]
    graph = AgentGraph(entry="play", exit="play", nodes=(LoopNode(
        id="play", env="textarena", system=system, template="{input}\n\n" + prompt, max_turns=8,
        max_tokens=12, temperature=0.0),))
    explore = {"exploration": {"kind": "count", "beta": BETA}} if arm == "count" else {}
    cfg = RLConfig(enabled=True, algorithm="grpo", group_size=8, inputs_per_step=4, steps=STEPS, lr=1e-4,
                   max_completion_tokens=96, temperature=0.7, dynamic_sampling=True, **explore)
    backend = HFBackend(BackendConfig(dtype="bfloat16", max_batch=64, cache=False))
    ctx = ExecContext(backend, ToolContext(), seed=seed)
    reward = RewardConfig()

    async def held_out() -> list[float]:
        """Per held-out board: the share of its sampled episodes that won."""
        sampled = replace(ctx, temperature=cfg.temperature)
        trajs = await rollout([(graph, ex, 10_000 + k) for ex in held for k in range(EPISODES)], sampled, reward)
        return [sum(t.reward or 0.0 for t in trajs[EPISODES * i : EPISODES * (i + 1)]) / EPISODES
                for i in range(len(held))]

    async def experiment() -> tuple[list[float], Any, list[float]]:
        before = await held_out()
        run_dir = Path.home() / ".cache" / "evoagent" / "campaigns" / "exploration" / f"{game}-{arm}-s{seed}"
        res = await RLPhase(cfg, backend, ctx, reward, run_dir, seed=seed).train([graph], train, generation=1)
        backend.weights_version = 1
        return before, res, await held_out()

    before, res, after = asyncio.run(experiment())
    per_step = res.metrics["per_step"]
    return {
        "game": env_id, "arm": arm, "beta": BETA if arm == "count" else None, "steps": STEPS,
        "rollouts": len(res.rollouts), "steps_trained": res.metrics["steps_trained"],
        "train_success": [round(s["accuracy"], 4) for s in per_step],
        "group_signal_share": [round(s["group_signal_share"], 4) for s in per_step],
        "shaped_group_signal_share": [round(s.get("shaped_group_signal_share", s["group_signal_share"]), 4)
                                      for s in per_step],
        "before": dict(zip((e.id for e in held), before, strict=True)),
        "per_input": dict(zip((e.id for e in held), after, strict=True)),
    }


def summarize(got: dict[cells.Cell, dict[str, Any]]) -> dict[str, Any]:
    """Per game: each arm's held-out success (mean of seeds, with its CI), count minus none,
    and the training signal shares."""
    from headline import bootstrap, interval, paired

    out: dict[str, Any] = {"beta": BETA, "steps": STEPS, "held_out_boards": HELD_OUT,
                           "episodes_per_board": EPISODES, "games": {}}
    for game in sorted({c.task for c in got}):
        seeds = sorted({c.seed for c in got if c.task == game})
        runs_of = {arm: {s: got[cells.Cell(game, arm, s)] for s in seeds} for arm in ARMS}
        per_seed = {s: vals for s, (_, vals) in paired(runs_of, "none").items()}
        boot = bootstrap(per_seed, np.random.default_rng(0))
        rows = {}
        for arm in ARMS:
            runs = list(runs_of[arm].values())
            rows[arm] = {
                "success_after": round(float(np.mean([per_seed[s][arm].mean() for s in seeds])), 3),
                "ci": interval(boot[arm]),
                "success_before": round(float(np.mean([np.mean(list(r["before"].values())) for r in runs])), 3),
                "train_success": round(float(np.mean([np.mean(r["train_success"]) for r in runs])), 3),
                "group_signal_share": round(float(np.mean([np.mean(r["group_signal_share"]) for r in runs])), 3),
                "shaped_group_signal_share": round(float(np.mean(
                    [np.mean(r["shaped_group_signal_share"]) for r in runs])), 3),
                "steps_trained": round(float(np.mean([r["steps_trained"] for r in runs])), 2),
                "rollouts": runs[0]["rollouts"],
            }
        out["games"][game] = {"seeds": seeds, "rows": rows, "count_minus_none": interval(boot["count"] - boot["none"])}
    return out


def markdown(figures: dict[str, Any]) -> str:
    lines = ["| game | arm | held-out success after (mean of seeds) | 95% CI | before | train success | "
             "groups with signal: task reward | trained reward | steps trained |",
             "|---|---|---|---|---|---|---|---|---|"]
    for game, g in figures["games"].items():
        for arm in ARMS:
            r = g["rows"][arm]
            lines.append(f"| {game} | {arm} | {r['success_after']:.3f} | [{r['ci'][0]:.3f}, {r['ci'][1]:.3f}] | "
                         f"{r['success_before']:.3f} | {r['train_success']:.3f} | {r['group_signal_share']:.3f} | "
                         f"{r['shaped_group_signal_share']:.3f} | {r['steps_trained']:.1f} of {figures['steps']} |")
        lo, hi = g["count_minus_none"]
        lines.append(f"| {game} | count - none | | [{lo:+.3f}, {hi:+.3f}] | | | | | |")
    lines += ["", f"Cells ran at commit {figures['commit'][:10]}; beta {figures['beta']}, {figures['steps']} GRPO "
              f"steps of 4 boards x 8 episodes per phase, {figures['held_out_boards']} held-out boards x "
              f"{figures['episodes_per_board']} episodes."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=FOLDER, help="where the cells are kept")
    ap.add_argument("--plan", action="store_true", help="list done and missing cells, and stop")
    ap.add_argument("--summarize", action="store_true", help="write exploration.json/.md from the cells, run none")
    ap.add_argument("--commit", help="the campaign's commit (default: the newest a done cell ran at)")
    ap.add_argument("--cell", nargs=3, metavar=("GAME", "ARM", "SEED"), help=argparse.SUPPRESS)
    cells.add_lane_args(ap)
    args = ap.parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"
    sys.path.insert(0, str(Path(__file__).parent))
    if args.cell:
        game, arm, seed = args.cell
        start = time.perf_counter()
        result = run_cell(game, arm, int(seed))
        print("wrote", cells.write(args.results, cells.Cell(game, arm, int(seed)), result,
                                   "python bench/exploration.py", time.perf_counter() - start))
        return
    grid = cells.grid(GAMES, ARMS, SEEDS)
    if args.plan or args.summarize:
        at = cells.summary_commit(args.commit, args.results, grid)
        if args.plan:
            print(cells.plan(args.results, grid, at, lambda c: 900.0).describe())
        else:
            write(args.results, grid, at)
        return
    head, dirty = cells.commit()
    todo = cells.plan(args.results, grid, head, lambda c: 900.0)
    print(todo.describe(), flush=True)
    if dirty:
        sys.exit("evoagent/ or bench/ has uncommitted changes: run it from a git worktree of one commit")
    argv = lambda c: [__file__, "--results", str(args.results), "--cell", c.task, c.row, str(c.seed)]  # noqa: E731
    if cells.run_missing(args.results, todo.missing, args, argv):
        write(args.results, grid, head)


def write(folder: Path, grid: list[cells.Cell], at: str) -> None:
    """exploration.json and .md beside ``folder``, from its cells of commit ``at``."""
    figures = summarize(cells.gather(folder, grid, at)) | {"commit": at}
    cells.write_summary(folder.parent / "exploration.json", figures, folder, grid, at, Path(__file__))
    (folder.parent / "exploration.md").write_text(markdown(figures))
    print(markdown(figures))


if __name__ == "__main__":
    main()
