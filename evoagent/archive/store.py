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
from pathlib import Path
from typing import IO

from evoagent.archive.reads import ArchiveReads
from evoagent.archive.records import GenerationWrite
from evoagent.errors import ArchiveError

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


class Archive(ArchiveReads):
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
                path, metrics, version = w.checkpoint
                self.db.execute(
                    "INSERT OR REPLACE INTO rl_checkpoints VALUES (?,?,?,?)",
                    (version, w.generation, path, json.dumps(metrics)),
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

