"""How the archive's read paths scale: 100,000 synthetic agents with lineage and evaluations.

Times, each the median of repeated calls, and each against a plain ``SELECT`` of the same rows
measured in the same run (the floor any implementation pays to read them):
  - ``list --top 20``: the 20 best agents with their val scores (``views.list_agents``);
  - ``show``: one agent by id prefix, with its evaluations and children (``views.agent_detail``);
  - ``lineage``: every ancestor edge of a late agent, with scores (``views.lineage_edges``);
  - parent selection: one ``islands`` draw of two parents from the pool; the pool itself is
    built once per generation by one query (``pool_build_ms``, reported apart).
Goals: list/show/lineage under 200 ms, selection under 10 ms. Writes milliseconds to
``bench/results/archive_scale.json`` (keys ``list_ms``, ``show_ms``, ``lineage_ms``,
``select_ms``, and ratios to the plain SELECTs).

    python bench/archive_scale.py [--agents 100000]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from results_io import write_results  # bench/ is sys.path[0] when a script runs

from evoagent.archive import AgentRecord, Archive, EvalRecord, GenerationWrite
from evoagent.archive.views import ListFilter, agent_detail, lineage_edges, list_agents
from evoagent.evolve.pool import Candidate, Pool
from evoagent.evolve.selection import get_selector
from evoagent.graph.model import AgentGraph, LLMNode
from evoagent.spec.config import SelectionConfig

PER_GENERATION = 1000
VAL = 32  # val examples: scores are k/32, as a real run's are


def fill(archive: Archive, n: int, seed: int = 0) -> list[str]:
    """``n`` agents in generations of 1000; each has a parent from the last three generations
    (selection favours recent agents) and, one time in twenty, a second one (crossover), so a
    late agent's lineage runs back through most of the generations."""
    rng = random.Random(seed)
    base = AgentGraph(entry="a", exit="a", nodes=(LLMNode(id="a"),))
    ids: list[str] = []
    for gen in range(n // PER_GENERATION):
        agents, evals = [], []
        for k in range(PER_GENERATION):
            g = base.replace_node(LLMNode(id="a", system=f"variant {gen}-{k}"))
            recent = ids[-3 * PER_GENERATION:]
            parents = () if gen == 0 else tuple(dict.fromkeys(
                rng.choice(recent) for _ in range(1 if rng.random() < 0.95 else 2)))
            status = "ok" if rng.random() < 0.9 else "invalid"
            agents.append(AgentRecord(g.id, g, parents, "seed" if gen == 0 else "mutate", gen,
                                      k % 4, status, None if status == "ok" else "did not apply"))
            if status == "ok":
                score = rng.randint(0, VAL) / VAL
                evals.append(EvalRecord(g.id, "val", "minibatch", 0, score, 8, 100, 0.1, gen))
                if score > 0.2:
                    evals.append(EvalRecord(g.id, "val", "full", 0, score, VAL, 400, 0.4, gen))
        archive.commit_generation(GenerationWrite(gen, 0, agents, evals, []))
        ids += [a.id for a in agents]
    return ids


def median_ms(fn: Callable[[], object], repeat: int = 15) -> float:
    fn()  # warm the page cache and SQLite's statement cache
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def plain(archive: Archive, ids: list[str]) -> Callable[[], object]:
    marks = ",".join("?" * len(ids))
    return lambda: archive.db.execute(f"SELECT * FROM agents WHERE id IN ({marks})", ids).fetchall()


def main(n: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        with Archive(Path(tmp) / "run") as w:
            ids = fill(w, n)
        print(f"filled {n:,} agents in {time.perf_counter() - t0:.0f}s")
        with Archive(Path(tmp) / "run", write=False) as a:
            top = list_agents(a, ListFilter(top=20))
            late = ids[-1]
            edges = lineage_edges(a, late)
            lineage_ids = sorted({e.parent for e in edges} | {late})
            cands = [Candidate(*row) for row in a.candidates("val", 0)]
            pool = Pool(cands)
            pick = get_selector("islands")
            cfg = SelectionConfig(islands=4)
            rng = random.Random(1)
            figures = {
                "agents": n,
                "list_ms": median_ms(lambda: list_agents(a, ListFilter(top=20))),
                "list_plain_ms": median_ms(plain(a, [r.id for r in top])),
                "show_ms": median_ms(lambda: agent_detail(a, late[:8])),
                "show_plain_ms": median_ms(lambda: (
                    a.db.execute("SELECT * FROM agents WHERE id = ?", (late,)).fetchall(),
                    a.db.execute("SELECT * FROM evaluations WHERE agent_id = ?", (late,)).fetchall())),
                "lineage_ms": median_ms(lambda: lineage_edges(a, late)),
                "lineage_plain_ms": median_ms(plain(a, lineage_ids)),
                "lineage_agents": len(lineage_ids),
                "select_ms": median_ms(lambda: pick(pool, 2, 1, 1, rng, cfg), repeat=50),
                "pool_build_ms": median_ms(lambda: Pool([Candidate(*r) for r in a.candidates("val", 0)]),
                                           repeat=5),
                "pool_plain_ms": median_ms(lambda: a.db.execute(
                    "SELECT agent_id, score FROM evaluations WHERE split='val' AND "
                    "weights_version=0 AND stage='full'").fetchall(), repeat=5),
                "pool_size": len(cands),
            }
            parents, _ = pick(pool, 2, 1, 1, rng, cfg)
            figures["select_plain_ms"] = median_ms(plain(a, [p.id for p in parents]), repeat=50)
    for key in ("list", "show", "lineage", "select", "pool_build"):
        base = figures[f"{key.removesuffix('_build')}_plain_ms"]
        figures[f"{key}_ratio"] = figures[f"{key}_ms"] / base if base else float("inf")
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in figures.items()}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, default=100_000)
    figs = main(ap.parse_args().agents)
    goals = {"list": 200, "show": 200, "lineage": 200, "select": 10}
    for key, goal in goals.items():
        ms = figs[f"{key}_ms"]
        print(f"{key:>8}: {ms:8.2f} ms (plain SELECT of the same rows {figs[f'{key}_plain_ms']:.2f} ms, "
              f"ratio {figs[f'{key}_ratio']:.1f}x; goal < {goal} ms: {'met' if ms < goal else 'MISSED'})")
    print(f"pool build (once per generation, {figs['pool_size']:,} candidates): "
          f"{figs['pool_build_ms']:.1f} ms (plain SELECT {figs['pool_plain_ms']:.1f} ms, "
          f"ratio {figs['pool_build_ratio']:.1f}x)")
    write_results("archive_scale", figs)
