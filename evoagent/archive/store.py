"""The archive: every agent variant, its lineage and evaluations, in one SQLite file.

It is the run's only state. The search loop writes one transaction per generation
(``commit_generation``), so a crash or Ctrl-C leaves the archive at the end of the last whole
generation and ``--resume`` continues from there; nothing else is read back. WAL mode lets
``evoagent archive ...`` read while a run writes; a lock file keeps a second writer out.
JSON columns hold versioned, plain data (no pickles).
"""

from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from evoagent.errors import ArchiveError
from evoagent.execute.trajectory import Trajectory
from evoagent.graph.io import graph_from_dict
from evoagent.graph.model import AgentGraph

SCHEMA_VERSION = 3  # v2: lineage; v3: status 'duplicate', insights (older archives upgrade on write)
DB_NAME = "archive.sqlite"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY, name TEXT NOT NULL, spec_json TEXT NOT NULL, started REAL NOT NULL);
CREATE TABLE IF NOT EXISTS agents (
    id TEXT PRIMARY KEY, graph_json TEXT NOT NULL, parents_json TEXT NOT NULL,
    operator TEXT NOT NULL, generation INTEGER NOT NULL, island INTEGER NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('ok', 'invalid', 'crashed', 'duplicate')), reason TEXT,
    created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS lineage (
    child TEXT NOT NULL REFERENCES agents(id), parent TEXT NOT NULL, position INTEGER NOT NULL,
    PRIMARY KEY (child, position));
CREATE INDEX IF NOT EXISTS lineage_parent ON lineage(parent);
CREATE TABLE IF NOT EXISTS evaluations (
    agent_id TEXT NOT NULL REFERENCES agents(id), split TEXT NOT NULL, stage TEXT NOT NULL,
    weights_version INTEGER NOT NULL, score REAL NOT NULL, n INTEGER NOT NULL,
    tokens INTEGER NOT NULL, seconds REAL NOT NULL, generation INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS eval_agent ON evaluations(agent_id, split, weights_version);
CREATE INDEX IF NOT EXISTS eval_rank ON evaluations(split, weights_version, stage, score);
CREATE INDEX IF NOT EXISTS agent_generation ON agents(generation);
CREATE TABLE IF NOT EXISTS trajectories (
    agent_id TEXT NOT NULL REFERENCES agents(id), split TEXT NOT NULL,
    weights_version INTEGER NOT NULL, input_id TEXT NOT NULL, reward REAL, json TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS traj_agent ON trajectories(agent_id, split);
CREATE INDEX IF NOT EXISTS traj_input ON trajectories(split, input_id);
CREATE TABLE IF NOT EXISTS generations (
    generation INTEGER PRIMARY KEY, weights_version INTEGER NOT NULL, committed REAL NOT NULL,
    best_id TEXT, best_score REAL);
CREATE TABLE IF NOT EXISTS insights (
    position INTEGER PRIMARY KEY, text TEXT NOT NULL, votes INTEGER NOT NULL,
    generation INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS rl_checkpoints (
    weights_version INTEGER PRIMARY KEY, generation INTEGER NOT NULL, path TEXT NOT NULL,
    metrics_json TEXT NOT NULL);
"""


@dataclass(frozen=True)
class AgentRecord:
    """One archived variant (valid or not) and where it came from."""

    id: str
    graph: AgentGraph | None
    parents: tuple[str, ...]
    operator: str
    generation: int
    island: int
    status: str
    reason: str | None


@dataclass(frozen=True)
class EvalRecord:
    agent_id: str
    split: str
    stage: str  # "minibatch" | "full"
    weights_version: int
    score: float
    n: int
    tokens: int
    seconds: float
    generation: int


@dataclass
class GenerationWrite:
    """Everything one generation adds; written atomically by ``commit_generation``."""

    generation: int
    weights_version: int
    agents: list[AgentRecord]
    evaluations: list[EvalRecord]
    trajectories: list[tuple[str, Trajectory, int]]  # (split, trajectory, weights version)
    checkpoint: tuple[str, dict[str, Any]] | None = None  # (path, metrics) of a new RL version
    usage: tuple[int, int] | None = None  # the run's model (calls, tokens) so far, if counted
    insights: list[tuple[str, int]] | None = None  # the insight memory's (text, votes), if changed
    meta: dict[str, Any] = field(default_factory=dict)  # run state others keep in meta (JSON values)


class Archive:
    """Open (creating if needed) the archive of one run folder."""

    def __init__(self, run_dir: Path, *, write: bool = True) -> None:
        self.run_dir = Path(run_dir)
        self._lock: IO[str] | None = None
        path = self.run_dir / DB_NAME
        if write:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._lock = _take_lock(self.run_dir / "archive.lock")
        elif not path.is_file():
            raise ArchiveError(f"no archive at {path}")
        # A reader opens the file read-only: no read command can ever modify an archive.
        target = str(path) if write else path.resolve().as_uri() + "?mode=ro"
        self.db = sqlite3.connect(target, timeout=30, isolation_level=None, uri=not write)
        self.db.row_factory = sqlite3.Row
        try:
            if write:
                self.db.execute("PRAGMA journal_mode=WAL")
                self.db.executescript(_SCHEMA)
            self._check_version(write)
        except sqlite3.DatabaseError as e:
            self.close()
            raise ArchiveError(f"{path}: not a readable evoagent archive ({e})") from None

    def _check_version(self, write: bool) -> None:
        row = self.db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row is None and not write:
            raise ArchiveError(f"{self.run_dir}: the archive has no schema version")
        if row is None:
            self.db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            return
        version = int(row["value"])
        if version > SCHEMA_VERSION or version < 1:
            raise ArchiveError(
                f"{self.run_dir}: archive schema v{row['value']}, this evoagent reads v{SCHEMA_VERSION}"
            )
        if version < SCHEMA_VERSION and write:
            self._upgrade(version)
        elif version == 1:
            raise ArchiveError(
                f"{self.run_dir}: archive schema v1, this evoagent reads v{SCHEMA_VERSION}; "
                "resume the run once (evoagent run TASK --resume) to upgrade it"
            )  # a v2 archive reads as it is: v3 only allows one more status

    def _upgrade(self, version: int) -> None:
        """v1 kept parents only as JSON; v2 indexes them (``lineage``) for children and ancestry.
        v3 lets an agent be a ``duplicate``: the agents table is rebuilt with the wider CHECK."""
        self.db.execute("BEGIN IMMEDIATE")
        if version < 2:
            self.db.execute("INSERT OR IGNORE INTO lineage SELECT a.id, j.value, j.key "
                            "FROM agents a, json_each(a.parents_json) j")
        if version < 3:
            table = _SCHEMA[_SCHEMA.index("CREATE TABLE IF NOT EXISTS agents"):]
            table = table[: table.index(";") + 1].replace("IF NOT EXISTS agents", "agents_v3")
            self.db.execute(table)
            self.db.execute("INSERT INTO agents_v3 SELECT * FROM agents")
            self.db.execute("DROP TABLE agents")
            self.db.execute("ALTER TABLE agents_v3 RENAME TO agents")
            self.db.execute("CREATE INDEX IF NOT EXISTS agent_generation ON agents(generation)")
        self.db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))
        self.db.execute("COMMIT")

    def close(self) -> None:
        self.db.close()
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def __enter__(self) -> Archive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writes ------------------------------------------------------------------------------
    def start_run(self, name: str, spec_json: str) -> None:
        """Record the run's spec once; a run resumed before its seeds committed keeps its row."""
        if self.run_spec() is None:
            self.db.execute(
                "INSERT INTO runs (name, spec_json, started) VALUES (?, ?, ?)",
                (name, spec_json, time.time()),
            )

    def run_spec(self) -> str | None:
        """The spec JSON the run started with, or None before it started."""
        row = self.db.execute("SELECT spec_json FROM runs ORDER BY id LIMIT 1").fetchone()
        return row["spec_json"] if row else None

    def commit_generation(self, w: GenerationWrite) -> None:
        """Write a whole generation in one transaction: all of it lands, or none."""
        now = time.time()
        try:
            self.db.execute("BEGIN IMMEDIATE")
            for a in w.agents:
                self.db.execute(
                    "INSERT OR IGNORE INTO agents VALUES (?,?,?,?,?,?,?,?,?)",
                    (
                        a.id,
                        a.graph.model_dump_json() if a.graph else "null",
                        json.dumps(list(a.parents)),
                        a.operator,
                        a.generation,
                        a.island,
                        a.status,
                        a.reason,
                        now,
                    ),
                )
            self.db.executemany(
                "INSERT OR IGNORE INTO lineage VALUES (?,?,?)",
                [(a.id, p, i) for a in w.agents for i, p in enumerate(a.parents)],
            )
            self.db.executemany(
                "INSERT INTO evaluations VALUES (?,?,?,?,?,?,?,?,?)",
                [
                    (e.agent_id, e.split, e.stage, e.weights_version, e.score, e.n, e.tokens,
                     e.seconds, e.generation)
                    for e in w.evaluations
                ],
            )
            self.db.executemany(
                "INSERT INTO trajectories VALUES (?,?,?,?,?,?)",
                [(t.agent_id, s, v, t.input_id, t.reward, t.to_json()) for s, t, v in w.trajectories],
            )
            if w.checkpoint is not None:
                path, metrics = w.checkpoint
                self.db.execute(
                    "INSERT OR REPLACE INTO rl_checkpoints VALUES (?,?,?,?)",
                    (w.weights_version, w.generation, path, json.dumps(metrics)),
                )
            if w.usage is not None:
                self.db.execute("INSERT OR REPLACE INTO meta VALUES ('usage', ?)", (json.dumps(w.usage),))
            for key, value in w.meta.items():
                self.db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, json.dumps(value)))
            if w.insights is not None:
                self.db.execute("DELETE FROM insights")
                self.db.executemany("INSERT INTO insights VALUES (?,?,?,?)",
                                    [(k, t, v, w.generation) for k, (t, v) in enumerate(w.insights)])
            best = self.best("val", w.weights_version)
            self.db.execute(
                "INSERT OR REPLACE INTO generations VALUES (?,?,?,?,?)",
                (w.generation, w.weights_version, now, best[0].id if best else None,
                 best[1] if best else None),
            )
            self.db.execute("COMMIT")
        except BaseException as e:
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            if isinstance(e, sqlite3.OperationalError):  # disk full, I/O error, locked
                raise ArchiveError(
                    f"cannot write generation {w.generation} to {self.run_dir}: {e}. Nothing of it "
                    "was kept: free space (or fix the folder) and continue with --resume"
                ) from e
            raise

    # -- reads -------------------------------------------------------------------------------
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
        return [_agent(r) for r in self.db.execute(q + " ORDER BY created, id", [v for _, v in where])]

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
        return _agent(row)

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
        """Valid agents whose ``split`` evaluation under ``version`` ended at the minibatch."""
        rows = self.db.execute(
            "SELECT a.*, e.score AS s FROM agents a JOIN evaluations e ON e.agent_id = a.id "
            "WHERE a.status='ok' AND e.split=? AND e.weights_version=? AND e.stage='minibatch' "
            "AND NOT EXISTS (SELECT 1 FROM evaluations f WHERE f.agent_id = a.id AND f.split=? "
            "AND f.weights_version=? AND f.stage='full') ORDER BY a.generation, a.id",
            (split, version, split, version),
        ).fetchall()
        return [(_agent(r), r["s"]) for r in rows]

    def best(self, split: str, version: int) -> tuple[AgentRecord, float] | None:
        """The valid agent with the best full score on ``split`` under ``version`` (ties: the
        older, then the smaller id), in one indexed query: it runs at every commit."""
        row = self.db.execute(
            "SELECT a.*, e.score AS s FROM evaluations e JOIN agents a ON a.id = e.agent_id "
            "WHERE e.split=? AND e.weights_version=? AND e.stage='full' AND a.status='ok' "
            "ORDER BY e.score DESC, a.generation, a.id LIMIT 1",
            (split, version),
        ).fetchone()
        return (_agent(row), row["s"]) if row else None

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


def _agent(r: sqlite3.Row) -> AgentRecord:
    raw = json.loads(r["graph_json"])
    return AgentRecord(
        id=r["id"],
        graph=graph_from_dict(raw, f"archive agent {r['id']}") if raw is not None else None,
        parents=tuple(json.loads(r["parents_json"])),
        operator=r["operator"],
        generation=r["generation"],
        island=r["island"],
        status=r["status"],
        reason=r["reason"],
    )


def _take_lock(path: Path) -> IO[str]:
    fh = open(path, "a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.close()
        raise ArchiveError(
            f"another evoagent process is writing to {path.parent}; wait for it or stop it"
        ) from None
    fh.seek(0)
    fh.truncate()
    fh.write(str(os.getpid()))
    fh.flush()
    return fh

