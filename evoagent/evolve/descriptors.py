"""Behaviour descriptors for MAP-Elites: a measurable property of an archived agent.

A descriptor is ``fn(archive, agent_ids) -> {agent id: value}``, registered by name and named
in ``evolve.selection.descriptors``; each is one SQL query over the archive (the only state),
so the grid is rebuilt every generation and survives ``--resume``. Built in:

- ``nodes``: nodes in the agent's graph (program size);
- ``llm_calls_per_input``: LLM completions per val execution (test-time compute);
- ``tokens_per_input``: completion tokens per val execution (its cost).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from evoagent.archive.store import Archive
from evoagent.errors import SpecError
from evoagent.registry import Registry

Descriptor = Callable[[Archive, Sequence[str]], dict[str, float]]
_REGISTRY: Registry[Descriptor] = Registry("descriptor", SpecError)
descriptor = _REGISTRY.register  # ``@descriptor("name")``: register a behaviour descriptor
known_descriptors = _REGISTRY.names
get_descriptor = _REGISTRY.get


def _query(archive: Archive, sql: str, ids: Sequence[str]) -> dict[str, float]:
    """``sql`` (``{ids}`` marks the id list) as {agent id: value}, in chunks SQLite accepts."""
    out: dict[str, float] = {}
    for i in range(0, len(ids), 900):
        chunk = list(ids[i : i + 900])
        rows = archive.db.execute(sql.format(ids=",".join("?" * len(chunk))), chunk)
        out.update({r[0]: float(r[1]) for r in rows if r[1] is not None})
    return out


@descriptor("nodes")
def nodes(archive: Archive, ids: Sequence[str]) -> dict[str, float]:
    return _query(archive, "SELECT id, json_array_length(graph_json, '$.nodes') FROM agents "
                           "WHERE id IN ({ids})", ids)


@descriptor("llm_calls_per_input")
def llm_calls_per_input(archive: Archive, ids: Sequence[str]) -> dict[str, float]:
    return _query(archive, "SELECT agent_id, AVG((SELECT COUNT(*) FROM json_each(t.json, '$.steps') s "
                           "WHERE json_extract(s.value, '$.kind') = 'llm')) FROM trajectories t "
                           "WHERE split = 'val' AND agent_id IN ({ids}) GROUP BY agent_id", ids)


@descriptor("tokens_per_input")
def tokens_per_input(archive: Archive, ids: Sequence[str]) -> dict[str, float]:
    return _query(archive, "SELECT agent_id, CAST(SUM(tokens) AS REAL) / MAX(SUM(n), 1) FROM evaluations "
                           "WHERE split = 'val' AND stage = 'full' AND agent_id IN ({ids}) "
                           "GROUP BY agent_id", ids)
