"""Read-side queries over an archive, for ``evoagent archive ...`` and ``evoagent report``.

Each view is one indexed SQL query (no Python loop over the whole table), so listing the top
agents, showing one, walking its lineage or drawing a parent stay in milliseconds at 100,000
agents (``bench/archive_scale.py``). Views never write: they work on an archive opened with
``write=False``, which SQLite opens read-only.

Scores: an agent's *val score under weights version V* is its full-val score under V when it
has one, else its cascade minibatch score (``stage`` says which); V defaults to the newest
weights version in the archive, since scores of different versions are not comparable.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Literal

from evoagent.archive.records import AgentRecord, EvalRecord
from evoagent.archive.store import Archive

Sort = Literal["score", "generation", "id"]

# An agent's best val score of one cascade stage under a weights version, by its id (an SQL
# expression). INDEXED BY: the planner would otherwise walk the score index of every evaluation.
_SCORE = ("(SELECT MAX(score) FROM evaluations e INDEXED BY eval_agent WHERE e.agent_id = {agent} "
          "AND e.split = 'val' AND e.weights_version = ? AND e.stage = '{stage}')")


@dataclass(frozen=True)
class ListFilter:
    """What ``archive list`` shows: a filter, an order and a cut."""

    sort: Sort = "score"
    top: int | None = None
    status: str | None = None
    island: int | None = None
    generation: int | None = None
    weights_version: int | None = None


@dataclass(frozen=True)
class AgentRow:
    """One line of ``archive list``."""

    id: str
    generation: int
    island: int
    operator: str
    parents: tuple[str, ...]
    status: str
    reason: str | None
    score: float | None
    stage: str | None  # "full" | "minibatch" | None (not evaluated under this version)
    weights_version: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def latest_version(archive: Archive) -> int:
    """The weights version the last committed generation ended with (0 for a fresh archive)."""
    row = archive.db.execute(
        "SELECT weights_version AS v FROM generations ORDER BY generation DESC LIMIT 1"
    ).fetchone()
    return int(row["v"]) if row else 0


def list_agents(archive: Archive, f: ListFilter = ListFilter()) -> list[AgentRow]:
    """Agents matching ``f``, each with its val score under ``f.weights_version``.

    By score: agents with a full val score first (best first), then those the cascade stopped
    at the minibatch, then the unscored (invalid, crashed, or not evaluated under that
    version). Each part walks an index in order and stops at ``f.top``, so ``--top 20`` reads
    about 20 rows whatever the archive's size.
    """
    version = latest_version(archive) if f.weights_version is None else f.weights_version
    where, args = [], []
    for column, value in (("status", f.status), ("island", f.island), ("generation", f.generation)):
        if value is not None:
            where.append(f"a.{column} = ?")
            args.append(value)
    cols = "a.id, a.generation, a.island, a.operator, a.parents_json, a.status, a.reason"
    full = ("EXISTS (SELECT 1 FROM evaluations x WHERE x.agent_id = a.id AND x.split = 'val' "
            "AND x.weights_version = ? AND x.stage = 'full')")
    if f.sort == "score":
        parts = [
            (f"SELECT {cols}, e.score AS val, 'full' AS stage FROM evaluations e JOIN agents a "
             "ON a.id = e.agent_id WHERE e.split = 'val' AND e.weights_version = ? AND "
             "e.stage = 'full'", [version], "e.score DESC, a.generation, a.id"),
            (f"SELECT {cols}, e.score AS val, 'minibatch' AS stage FROM evaluations e JOIN agents a "
             "ON a.id = e.agent_id WHERE e.split = 'val' AND e.weights_version = ? AND "
             f"e.stage = 'minibatch' AND NOT {full}", [version, version], "e.score DESC, a.generation, a.id"),
            (f"SELECT {cols}, NULL AS val, NULL AS stage FROM agents a WHERE NOT EXISTS (SELECT 1 "
             "FROM evaluations x WHERE x.agent_id = a.id AND x.split = 'val' AND "
             "x.weights_version = ?)", [version], "a.generation, a.id"),
        ]
    else:
        fs, ms = (_SCORE.format(agent="a.id", stage=st) for st in ("full", "minibatch"))
        parts = [(
            f"SELECT {cols}, COALESCE({fs}, {ms}) AS val, CASE WHEN {full} THEN 'full' "
            f"WHEN {ms} IS NOT NULL THEN 'minibatch' END AS stage FROM agents a WHERE 1", [version] * 4,
            "a.generation, a.id" if f.sort == "generation" else "a.id",
        )]
    out: list[AgentRow] = []
    seen: set[str] = set()
    for sql, params, order in parts:
        left = None if f.top is None else f.top - len(out)
        if left is not None and left <= 0:
            break
        query = sql + "".join(f" AND {w}" for w in where) + f" ORDER BY {order}"
        for r in archive.db.execute(query + (f" LIMIT {left}" if left is not None else ""), [*params, *args]):
            if r["id"] not in seen:  # an agent scored twice under one version shows once
                seen.add(r["id"])
                out.append(AgentRow(r["id"], r["generation"], r["island"], r["operator"],
                                    tuple(json.loads(r["parents_json"])), r["status"], r["reason"],
                                    r["val"], r["stage"], version))
    return out


@dataclass(frozen=True)
class LineageEdge:
    """``parent`` -> ``child`` with the operator that made the child and the score change."""

    child: str
    parent: str
    operator: str
    child_score: float | None
    parent_score: float | None


def lineage_edges(archive: Archive, agent_id: str, version: int | None = None) -> list[LineageEdge]:
    """Every parent edge among ``agent_id``'s ancestors, nearest first (breadth-first).

    One recursive query collects the ancestor set (each id once, however many paths reach
    it), a second reads their edges with scores; the order is a BFS over those edges.
    """
    v = latest_version(archive) if version is None else version
    rows = archive.db.execute(
        # CROSS JOIN keeps the (small) ancestor set as the outer loop: each step is an index
        # lookup, never a scan of the lineage table.
        "WITH RECURSIVE anc(id) AS (SELECT ? UNION SELECT l.parent FROM anc CROSS JOIN lineage l "
        "ON l.child = anc.id) "
        f"SELECT l.child, l.parent, a.operator, {_SCORE.format(agent='l.child', stage='full')} AS cs, "
        f"{_SCORE.format(agent='l.parent', stage='full')} AS ps FROM anc CROSS JOIN lineage l "
        "ON l.child = anc.id "
        "CROSS JOIN agents a ON a.id = l.child ORDER BY l.child, l.position",
        (agent_id, v, v),
    ).fetchall()
    by_child: dict[str, list[LineageEdge]] = {}
    for r in rows:
        by_child.setdefault(r["child"], []).append(
            LineageEdge(r["child"], r["parent"], r["operator"], r["cs"], r["ps"]))
    out, queue, seen = [], [agent_id], {agent_id}
    while queue:
        child = queue.pop(0)
        for e in by_child.get(child, []):
            out.append(e)
            if e.parent not in seen:
                seen.add(e.parent)
                queue.append(e.parent)
    return out


@dataclass(frozen=True)
class AgentDetail:
    """Everything ``archive show`` prints about one agent."""

    record: AgentRecord
    evaluations: list[EvalRecord]
    children: list[str]
    rolled_back: frozenset[int] = frozenset()  # weights versions whose phase was rolled back

    @property
    def cost(self) -> dict[str, float]:
        """Tokens generated and seconds spent over all of its evaluations."""
        return {"tokens": sum(e.tokens for e in self.evaluations),
                "seconds": round(sum(e.seconds for e in self.evaluations), 3)}

    def to_dict(self) -> dict[str, Any]:
        r = self.record
        return {
            "id": r.id, "generation": r.generation, "island": r.island, "operator": r.operator,
            "parents": list(r.parents), "children": self.children, "status": r.status,
            "reason": r.reason, "cost": self.cost,
            "evaluations": [{**asdict(e), "rolled_back": e.weights_version in self.rolled_back}
                            for e in self.evaluations],
            "graph": r.graph.model_dump(mode="json") if r.graph else None,
        }


def agent_detail(archive: Archive, prefix: str) -> AgentDetail:
    """The agent named by an id or unique prefix, with its evaluations and children."""
    agent = archive.agent(prefix)
    children = [r["child"] for r in archive.db.execute(
        "SELECT child FROM lineage WHERE parent = ? ORDER BY child", (agent.id,)
    )]
    return AgentDetail(agent, archive.evaluations(agent.id), children, rolled_back(archive))


def rolled_back(archive: Archive) -> frozenset[int]:
    """Weights versions whose RL phase hurt and was rolled back (``rl.rollback``): scored once,
    never served after."""
    return frozenset(p["weights_version"] for p in rl_phases(archive) if p.get("rolled_back"))


@dataclass(frozen=True)
class GenerationPoint:
    """One generation of one island: best and median full-val score of its population."""

    generation: int
    island: int
    weights_version: int
    best: float
    median: float
    size: int


def curves(archive: Archive) -> list[GenerationPoint]:
    """Per committed generation and island: the population so far, scored under the weights
    version that generation ended with (scores of other versions are not comparable)."""
    gens = [(g["generation"], g["weights_version"]) for g in archive.generations()]
    rows = archive.db.execute(
        "SELECT a.id, a.generation, a.island, e.weights_version AS v, MAX(e.score) AS s "
        "FROM agents a JOIN evaluations e ON e.agent_id = a.id WHERE a.status = 'ok' AND "
        "e.split = 'val' AND e.stage = 'full' GROUP BY a.id, e.weights_version"
    ).fetchall()
    out = []
    for gen, version in gens:
        by_island: dict[int, list[float]] = {}
        for r in rows:
            if r["v"] == version and r["generation"] <= gen:
                by_island.setdefault(r["island"], []).append(r["s"])
        for island, scores in sorted(by_island.items()):
            scores.sort()
            out.append(GenerationPoint(gen, island, version, scores[-1], _median(scores), len(scores)))
    return out


def _median(xs: list[float]) -> float:
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


@dataclass(frozen=True)
class OperatorStats:
    """How one operator did: children made, valid, improving on their best parent, cost."""

    operator: str
    children: int
    valid: int
    invalid: int
    crashed: int
    duplicate: int  # refused by novelty before any evaluation
    improved: int
    tokens: int

    @property
    def improvement_rate(self) -> float:
        return self.improved / self.children if self.children else 0.0


@dataclass(frozen=True)
class Outcome:
    """One child an operator made: when, whether it was valid, whether it improved."""

    operator: str
    generation: int
    status: str
    improved: bool
    tokens: int


def operator_outcomes(archive: Archive) -> list[Outcome]:
    """Every non-seed agent as its operator's outcome: improvement means a full-val score above
    every parent's under the same weights version; tokens are what its evaluations used."""
    rows = archive.db.execute(
        "SELECT a.id, a.operator, a.generation, a.status, a.parents_json, "
        "(SELECT COALESCE(SUM(tokens), 0) FROM evaluations e WHERE e.agent_id = a.id) AS tokens "
        "FROM agents a WHERE a.operator != 'seed' ORDER BY a.generation, a.id"
    ).fetchall()
    best: dict[str, dict[int, float]] = {}  # agent -> weights version -> full val score
    for r in archive.db.execute(
        "SELECT agent_id, weights_version AS v, MAX(score) AS s FROM evaluations "
        "WHERE split = 'val' AND stage = 'full' GROUP BY agent_id, weights_version"
    ):
        best.setdefault(r["agent_id"], {})[r["v"]] = r["s"]

    def improved(child: str, parents: list[str]) -> bool:
        return any(
            all(v in best.get(p, {}) and score > best[p][v] for p in parents)
            for v, score in best.get(child, {}).items()
        ) if parents else False

    return [Outcome(r["operator"], r["generation"], r["status"],
                    improved(r["id"], json.loads(r["parents_json"])), r["tokens"]) for r in rows]


def operator_stats(archive: Archive) -> list[OperatorStats]:
    """Per operator (seeds excluded): children, their statuses, improvements, cost."""
    stats: dict[str, dict[str, int]] = {}
    for o in operator_outcomes(archive):
        s = stats.setdefault(o.operator, dict.fromkeys(
            ("children", "valid", "invalid", "crashed", "duplicate", "improved", "tokens"), 0))
        s["children"] += 1
        s[{"ok": "valid"}.get(o.status, o.status)] += 1
        s["tokens"] += o.tokens
        s["improved"] += o.improved
    return [OperatorStats(op, **s) for op, s in sorted(stats.items())]


def instance_scores(archive: Archive, agent_ids: list[str], version: int) -> dict[str, dict[str, float]]:
    """``{agent: {input id: reward}}`` on val under ``version``: which inputs each one solves."""
    if not agent_ids:
        return {}
    marks = ",".join("?" * len(agent_ids))
    out: dict[str, dict[str, float]] = {a: {} for a in agent_ids}
    for r in archive.db.execute(
        f"SELECT agent_id, input_id, reward FROM trajectories WHERE split = 'val' "
        f"AND weights_version = ? AND agent_id IN ({marks}) ORDER BY rowid",
        (version, *agent_ids),
    ):
        out[r["agent_id"]][r["input_id"]] = r["reward"] or 0.0
    return out


def rl_phases(archive: Archive) -> list[dict[str, Any]]:
    """Each RL phase: the weights version it made, its generation and its metrics (with the
    per-step list under ``"per_step"`` when the phase recorded one)."""
    return [
        {"weights_version": r["weights_version"], "generation": r["generation"],
         **json.loads(r["metrics_json"])}
        for r in archive.checkpoints()
    ]
