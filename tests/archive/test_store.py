"""The archive: whole generations or nothing, one writer, lineage back to the seeds."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from evoagent.archive import AgentRecord, Archive, EvalRecord, GenerationWrite
from evoagent.archive.views import lineage_edges
from evoagent.errors import ArchiveError
from evoagent.execute.trajectory import Trajectory
from evoagent.graph import load_graph

ROOT = Path(__file__).resolve().parents[2]
G = load_graph(ROOT / "graphs" / "direct.yaml")
G2 = G.replace_node(G.node("answer").model_copy(update={"system": "Be exact."}))


def rec(g, parents=(), gen=0, op="seed"):
    return AgentRecord(g.id, g, tuple(parents), op, gen, 0, "ok", None)


def ev(agent_id, score, gen=0, version=0, split="val"):
    return EvalRecord(agent_id, split, "full", version, score, 4, 10, 0.1, gen)


def test_generation_commit_and_queries(tmp_path):
    with Archive(tmp_path / "run") as a:
        t = Trajectory(agent_id=G.id, input_id="e1", input="q", output="a", reward=1.0)
        a.commit_generation(GenerationWrite(0, 0, [rec(G)], [ev(G.id, 0.25)], [("val", t, 0)]))
        a.commit_generation(GenerationWrite(1, 0, [rec(G2, [G.id], 1, "reflective_rewrite")],
                                            [ev(G2.id, 0.5, 1)], []))
        assert a.last_generation() == (1, 0)
        assert a.best("val", 0)[0].id == G2.id
        assert [(e.child, e.parent) for e in lineage_edges(a, G2.id)] == [(G2.id, G.id)]
        assert a.agent(G2.id[:6]).id == G2.id
        assert next(a.trajectories(G.id)).output == "a"
        assert a.agent(G2.id).graph == G2
    # a reader sees the same while nothing writes
    with Archive(tmp_path / "run", write=False) as r:
        assert r.score(G2.id, "val", 0) == 0.5


def test_a_failed_commit_leaves_nothing(tmp_path):
    with Archive(tmp_path / "run") as a:
        a.commit_generation(GenerationWrite(0, 0, [rec(G)], [ev(G.id, 0.25)], []))
        broken = GenerationWrite(1, 0, [rec(G2, [G.id], 1)], [ev(G2.id, 0.5, 1)], [("val", None, 0)])
        with pytest.raises(AttributeError):
            a.commit_generation(broken)  # type: ignore[arg-type]
        assert a.last_generation() == (0, 0)
        assert G2.id not in a.known_ids()


def test_a_second_writer_is_refused(tmp_path):
    with Archive(tmp_path / "run"):
        with pytest.raises(ArchiveError, match="another evoagent process is writing"):
            Archive(tmp_path / "run")


def test_schema_version_is_checked(tmp_path):
    Archive(tmp_path / "run").close()
    db = sqlite3.connect(tmp_path / "run" / "archive.sqlite")
    db.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    db.commit()
    db.close()
    with pytest.raises(ArchiveError, match="schema v99"):
        Archive(tmp_path / "run")


def test_unknown_or_ambiguous_ids(tmp_path):
    with Archive(tmp_path / "run") as a:
        a.commit_generation(GenerationWrite(0, 0, [rec(G), rec(G2)], [], []))
        with pytest.raises(ArchiveError, match="no agent with id 'zzz'"):
            a.agent("zzz")
        with pytest.raises(ArchiveError, match="2 agents"):
            a.agent("")
    with pytest.raises(ArchiveError, match="no archive"):
        Archive(tmp_path / "elsewhere", write=False)


def test_read_commands_give_one_line_errors_on_a_corrupt_archive(tmp_path):
    from typer.testing import CliRunner

    from evoagent.cli import app

    run = tmp_path / "run"
    run.mkdir()
    (run / "archive.sqlite").write_bytes(b"this is not sqlite" * 100)
    res = CliRunner().invoke(app, ["archive", "list", str(run)])
    assert res.exit_code == 2 and "not a readable evoagent archive" in res.output
    assert "Traceback" not in res.output


def test_children_the_cascade_stopped_are_listed_with_their_minibatch_score(tmp_path):
    G3 = G.replace_node(G.node("answer").model_copy(update={"temperature": 0.7}))
    mini = lambda agent_id, score: EvalRecord(agent_id, "val", "minibatch", 0, score, 2, 5, 0.1, 1)  # noqa: E731
    with Archive(tmp_path / "run") as a:
        a.commit_generation(GenerationWrite(0, 0, [rec(G)], [ev(G.id, 0.25)], []))
        a.commit_generation(GenerationWrite(
            1, 0, [rec(G2, [G.id], 1, "param_search"), rec(G3, [G.id], 1, "param_search")],
            [mini(G2.id, 0.0), mini(G3.id, 0.5), ev(G3.id, 0.4, 1)], []))
        assert [(r.id, s) for r, s in a.stopped("val", 0)] == [(G2.id, 0.0)]
        assert a.stopped("val", 1) == []


def test_disk_full_at_commit_keeps_nothing_of_the_generation_and_says_resume(tmp_path):
    with Archive(tmp_path / "run") as a:
        a.commit_generation(GenerationWrite(0, 0, [rec(G)], [ev(G.id, 0.25)], []))
        # SQLite reports a full disk as SQLITE_FULL; a tiny page limit makes it real.
        a.db.execute("PRAGMA max_page_count = " + str(a.db.execute("PRAGMA page_count").fetchone()[0]))
        big = Trajectory(agent_id=G2.id, input_id="e1", input="q" * 200_000, output="a", reward=1.0)
        with pytest.raises(ArchiveError, match=r"cannot write generation 1 .*full.*--resume"):
            a.commit_generation(GenerationWrite(1, 0, [rec(G2, [G.id], 1)], [ev(G2.id, 0.5, 1)],
                                                [("val", big, 0)]))
        assert a.last_generation() == (0, 0) and G2.id not in a.known_ids()


def test_a_v1_archive_is_upgraded_by_a_writer_and_refused_by_a_reader(tmp_path):
    with Archive(tmp_path / "run") as a:
        a.commit_generation(GenerationWrite(0, 0, [rec(G)], [ev(G.id, 0.25)], []))
        a.commit_generation(GenerationWrite(1, 0, [rec(G2, [G.id], 1, "x")], [ev(G2.id, 0.5, 1)], []))
        a.db.execute("DELETE FROM lineage")
        a.db.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    with pytest.raises(ArchiveError, match=r"schema v1.*--resume\) to upgrade it"):
        Archive(tmp_path / "run", write=False)
    with Archive(tmp_path / "run") as a:
        assert [(e.child, e.parent) for e in lineage_edges(a, G2.id)] == [(G2.id, G.id)]
    with Archive(tmp_path / "run", write=False) as r:
        assert r.best("val", 0)[0].id == G2.id


def test_a_v2_archive_reads_as_it_is_and_takes_duplicates_once_upgraded(tmp_path):
    from dataclasses import replace

    with Archive(tmp_path / "run") as a:
        a.commit_generation(GenerationWrite(0, 0, [rec(G)], [ev(G.id, 0.25)], []))
        sql = a.db.execute("SELECT sql FROM sqlite_master WHERE name = 'agents'").fetchone()[0]
        a.db.executescript(  # as v2 wrote it: no 'duplicate' status
            sql.replace("agents", "agents_v2", 1).replace(", 'duplicate'", "") + ";"
            "INSERT INTO agents_v2 SELECT * FROM agents; DROP TABLE agents;"
            "ALTER TABLE agents_v2 RENAME TO agents;"
            "UPDATE meta SET value = '2' WHERE key = 'schema_version';"
        )
        with pytest.raises(sqlite3.IntegrityError):
            a.db.execute("UPDATE agents SET status = 'duplicate'")
    with Archive(tmp_path / "run", write=False) as r:  # a reader needs no upgrade
        assert r.best("val", 0)[0].id == G.id
    dup = replace(rec(G2, [G.id], 1, "reflective_rewrite"), status="duplicate", reason=f"0.97 similar to {G.id}")
    with Archive(tmp_path / "run") as a:
        a.commit_generation(GenerationWrite(1, 0, [dup], [], []))
        assert a.agent(G2.id).status == "duplicate" and a.agent(G.id).status == "ok"
        assert a.db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == "3"
