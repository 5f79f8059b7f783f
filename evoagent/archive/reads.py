"""The archive's reads: every query the search, the RL phase, the CLI and the report ask of a
run's SQLite file. ``Archive`` (``store.py``) inherits them and adds the writes; a read never
writes, and works as well on an archive opened with ``write=False``.

Each is one indexed SQL query; the views the CLI and the report draw from these rows are in
``views.py``.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from evoagent.archive.records import AgentRecord, EvalRecord, agent_from_row
from evoagent.errors import ArchiveError
from evoagent.execute.trajectory import Trajectory
from evoagent.graph.io import graph_from_dict
from evoagent.graph.model import AgentGraph


class ArchiveReads:
    """The read queries over ``db``, the open archive of ``run_dir``."""

    db: sqlite3.Connection
    run_dir: Path

    def run_spec(self) -> str | None:
        """The spec JSON the run started with, or None before it started."""
        row = self.db.execute("SELECT spec_json FROM runs ORDER BY id LIMIT 1").fetchone()
        return row["spec_json"] if row else None

    def last_generation(self) -> tuple[int, int] | None:
        """(generation, weights version) of the last committed generation, or None."""
        row = self.db.execute(
            "SELECT generation, weights_version FROM generations ORDER BY generation DESC LIMIT 1"
        ).fetchone()
        return (row["generation"], row["weights_version"]) if row else None

    def agents(self, status: str | None = None, operator: str | None = None) -> list[AgentRecord]:
        """Archived agents in write order, optionally of one status or operator."""
        where = [(c, v) for c, v in (("status", status), ("operator", operator)) if v is not None]
        q = "SELECT * FROM agents" + (" WHERE " + " AND ".join(f"{c} = ?" for c, _ in where) if where else "")
        return [agent_from_row(r) for r in self.db.execute(q + " ORDER BY created, id", [v for _, v in where])]

    def resolve(self, prefix: str) -> str:
        """The full id of the agent whose id is ``prefix`` or starts with it (unique prefix).

        A range on the primary key: an index seek, not a scan. Unknown or ambiguous ids raise
        ArchiveError; an ambiguous one lists a few of the ids it matches.
        """
        span = (prefix, prefix + "\uffff")
        rows = self.db.execute(
            "SELECT id FROM agents WHERE id >= ? AND id < ? ORDER BY id LIMIT 5", span
        ).fetchall()
        if not rows:
            raise ArchiveError(f"no agent with id {prefix!r} in {self.run_dir}")
        if len(rows) > 1 and rows[0]["id"] != prefix:
            n = self.db.execute("SELECT COUNT(*) FROM agents WHERE id >= ? AND id < ?", span).fetchone()[0]
            some = ", ".join(r["id"] for r in rows)
            raise ArchiveError(
                f"{n} agents with id prefix {prefix!r} in {self.run_dir} (ambiguous): {some}"
                + (", ..." if n > len(rows) else "")
            )
        return rows[0]["id"]

    def agent(self, agent_id: str) -> AgentRecord:
        """The agent whose id is ``agent_id`` or starts with it (see ``resolve``)."""
        row = self.db.execute("SELECT * FROM agents WHERE id = ?", (self.resolve(agent_id),)).fetchone()
        return agent_from_row(row)

    def evaluations(self, agent_id: str | None = None) -> list[EvalRecord]:
        q = "SELECT * FROM evaluations" + (" WHERE agent_id = ?" if agent_id else "")
        return [EvalRecord(**dict(r)) for r in self.db.execute(q, (agent_id,) if agent_id else ())]

    def score(self, agent_id: str, split: str, version: int) -> float | None:
        """The agent's latest full-stage score on ``split`` under weights ``version``."""
        row = self.db.execute(
            "SELECT score FROM evaluations WHERE agent_id=? AND split=? AND weights_version=? "
            "AND stage='full' ORDER BY rowid DESC LIMIT 1",
            (agent_id, split, version),
        ).fetchone()
        return row["score"] if row else None

    def stopped(self, split: str, version: int) -> list[tuple[AgentRecord, float]]:
        """Valid agents the cascade stopped under ``version``: a minibatch score on ``split``
        (the cascade's first stage: val or train), no full val score."""
        rows = self.db.execute(
            "SELECT a.*, e.score AS s FROM agents a JOIN evaluations e ON e.agent_id = a.id "
            "WHERE a.status='ok' AND e.split=? AND e.weights_version=? AND e.stage='minibatch' "
            "AND NOT EXISTS (SELECT 1 FROM evaluations f WHERE f.agent_id = a.id AND f.split='val' "
            "AND f.weights_version=? AND f.stage='full') ORDER BY a.generation, a.id",
            (split, version, version),
        ).fetchall()
        return [(agent_from_row(r), r["s"]) for r in rows]

    def best(self, split: str, version: int) -> tuple[AgentRecord, float] | None:
        """The valid agent with the best full score on ``split`` under ``version`` (ties: the
        older, then the smaller id), in one indexed query: it runs at every commit."""
        row = self.db.execute(
            "SELECT a.*, e.score AS s FROM evaluations e JOIN agents a ON a.id = e.agent_id "
            "WHERE e.split=? AND e.weights_version=? AND e.stage='full' AND a.status='ok' "
            "ORDER BY e.score DESC, a.generation, a.id LIMIT 1",
            (split, version),
        ).fetchone()
        return (agent_from_row(row), row["s"]) if row else None

    def trajectories(
        self, agent_id: str, split: str | None = None, version: int | None = None
    ) -> Iterator[Trajectory]:
        """The agent's archived trajectories in write order, optionally of one split / version."""
        q, args = "SELECT json FROM trajectories WHERE agent_id=?", [agent_id]
        if split is not None:
            q, args = q + " AND split=?", [*args, split]
        if version is not None:
            q, args = q + " AND weights_version=?", [*args, version]
        for r in self.db.execute(q + " ORDER BY rowid", args):
            yield Trajectory.from_json(r["json"])

    def trajectories_of_inputs(self, split: str, input_ids: Sequence[str]) -> list[Trajectory]:
        """Every agent's archived trajectories on these inputs of ``split``, in write order
        (the RL phase's DPO pairs: the archive holds successes and failures of many agents)."""
        marks = ",".join("?" * len(input_ids))
        rows = self.db.execute(
            f"SELECT json FROM trajectories WHERE split=? AND input_id IN ({marks}) ORDER BY rowid",
            [split, *input_ids],
        )
        return [Trajectory.from_json(r["json"]) for r in rows]

    def generations(self) -> list[sqlite3.Row]:
        return self.db.execute("SELECT * FROM generations ORDER BY generation").fetchall()

    def checkpoints(self) -> list[sqlite3.Row]:
        return self.db.execute("SELECT * FROM rl_checkpoints ORDER BY weights_version").fetchall()

    def candidates(self, split: str, version: int) -> list[tuple[str, float, int, int, int, int]]:
        """(id, score, island, children, generation, scored under) of every valid agent with a
        full score on ``split``: the selection pool, in one query (children counted once).

        An agent's score is its latest under a weights version up to ``version``, with that
        version: after an RL phase the agents not re-scored stay selectable, marked stale.
        """
        return [tuple(r) for r in self.db.execute(
            "WITH kids AS (SELECT parent AS id, COUNT(*) AS n FROM lineage GROUP BY parent), "
            "last AS (SELECT agent_id, MAX(weights_version) AS v FROM evaluations "
            "WHERE split = ? AND stage = 'full' AND weights_version <= ? GROUP BY agent_id) "
            "SELECT a.id, MAX(e.score), a.island, COALESCE(k.n, 0), a.generation, l.v FROM agents a "
            "JOIN last l ON l.agent_id = a.id "
            "JOIN evaluations e ON e.agent_id = a.id AND e.split = ? AND e.stage = 'full' "
            "AND e.weights_version = l.v LEFT JOIN kids k ON k.id = a.id "
            "WHERE a.status = 'ok' GROUP BY a.id",
            (split, version, split),
        )]

    def graph(self, agent_id: str) -> AgentGraph:
        """The graph of the agent with exactly this id (an ArchiveError if it has none)."""
        row = self.db.execute("SELECT graph_json FROM agents WHERE id = ?", (agent_id,)).fetchone()
        raw = json.loads(row["graph_json"]) if row else None
        if raw is None:
            raise ArchiveError(f"no graph for agent {agent_id!r} in {self.run_dir}")
        return graph_from_dict(raw, f"archive agent {agent_id}")

    def usage(self) -> tuple[int, int]:
        """(completions, tokens) the run's models generated up to the last commit (RL rollouts
        and mutator calls included, cache hits not): what ``evolve.max_calls`` counts."""
        row = self.db.execute("SELECT value FROM meta WHERE key='usage'").fetchone()
        calls, tokens = json.loads(row["value"]) if row else (0, 0)
        return int(calls), int(tokens)

    def meta(self, key: str) -> Any:
        """A value a generation wrote with ``GenerationWrite.meta`` (None if none was)."""
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return json.loads(row["value"]) if row else None

    def insights(self) -> list[tuple[str, int]]:
        """The insight memory as of the last commit: (text, votes), most votes first. A v2
        archive opened read-only has no such table: no insights."""
        try:
            rows = self.db.execute("SELECT text, votes FROM insights ORDER BY position").fetchall()
        except sqlite3.OperationalError:
            return []
        return [(r["text"], r["votes"]) for r in rows]

    def cost(self) -> tuple[int, int]:
        """(agent executions, generated tokens) over every evaluation so far."""
        row = self.db.execute("SELECT COALESCE(SUM(n), 0) AS n, COALESCE(SUM(tokens), 0) AS t "
                              "FROM evaluations").fetchone()
        return int(row["n"]), int(row["t"])

    def known_ids(self) -> set[str]:
        return {r["id"] for r in self.db.execute("SELECT id FROM agents")}
