"""The archive's records: what one row of ``agents`` and ``evaluations`` holds, and what one
generation writes (``GenerationWrite``); plain frozen data, shared by the writer and the reads."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from typing import Any

from evoagent.execute.trajectory import Trajectory
from evoagent.graph.io import graph_from_dict
from evoagent.graph.model import AgentGraph


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
    # (path, metrics, version) of an RL phase's weights: ``weights_version`` unless rolled back
    checkpoint: tuple[str, dict[str, Any], int] | None = None
    usage: tuple[int, int] | None = None  # the run's model (calls, tokens) so far, if counted
    insights: list[tuple[str, int]] | None = None  # the insight memory's (text, votes), if changed
    meta: dict[str, Any] = field(default_factory=dict)  # run state others keep in meta (JSON values)


def agent_from_row(r: sqlite3.Row) -> AgentRecord:
    """The ``AgentRecord`` of one ``agents`` row (its graph parsed and validated)."""
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
