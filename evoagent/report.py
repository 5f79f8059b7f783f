"""``evoagent report RUN``: one self-contained HTML file that shows what a search found.

Sections (each an element id, so tests and users can link to it):
  - ``curves``: best and median val score per generation per island, RL phases marked with
    the weights version they produced;
  - ``lineage``: the ancestry of the best agents, one edge colour per operator;
  - ``graph-<id>``: each top agent's graph (nodes by kind, tools, edges, edge probabilities);
  - ``instances``: which val inputs each top agent solves;
  - ``operators``: per operator, children made, valid, improving on their parents, tokens spent;
  - ``grid``: with ``selection.kind: map_elites``, each occupied cell, its elite and occupancy;
  - ``insights``: the insight memory (ExpeL) with each rule's votes, when the run kept one;
  - ``rl``: reward, accuracy, loss (and KL when trained with it) per RL step;
  - ``schedule``: each step (search generation or RL phase), its cost and val gain, and which
    phases were rolled back;
  - ``code``: each agent whose own tool code (a python tool's ``source``) differs from its
    parent's, as a unified diff, and the ``rewrite_tool`` children archived as invalid, with why.

plotly.js is embedded once (no network needed to open the file); everything is read from the
archive, opened read-only.
"""

from __future__ import annotations

import html
from pathlib import Path

import networkx as nx
import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from evoagent.archive.store import Archive
from evoagent.archive.views import (
    ListFilter,
    curves,
    instance_scores,
    latest_version,
    lineage_edges,
    list_agents,
    operator_stats,
    rl_phases,
)
from evoagent.graph.diff import graph_diff
from evoagent.graph.model import AgentGraph, LLMNode, LoopNode, ToolNode, VoteNode
from evoagent.rl.schedule import Step, recorded

TOP = 5
KIND_COLOURS = {"llm": "#4c78a8", "tool": "#f58518", "loop": "#54a24b", "vote": "#b279a2"}
PALETTE = ["#4c78a8", "#f58518", "#e45756", "#72b7b2", "#54a24b", "#eeca3b", "#b279a2",
           "#ff9da6", "#9d755d", "#bab0ac"]


def write_report(run_dir: Path, out: Path | None = None, top: int = TOP) -> Path:
    """Write the report of the run in ``run_dir`` (default: ``run_dir/report.html``)."""
    out = out or Path(run_dir) / "report.html"
    with Archive(run_dir, write=False) as archive:
        version = latest_version(archive)
        best = [r for r in list_agents(archive, ListFilter(status="ok", weights_version=version))
                if r.stage == "full"][:top]
        graphs = {r.id: archive.graph(r.id) for r in best}
        sections = [
            ("curves", "Score per generation", _figure(_curves(archive), "curves")),
            ("lineage", "Lineage of the best agents", _figure(_lineage(archive, [r.id for r in best]), "lineage")),
            ("graphs", "Top agents' graphs", "".join(
                f"<h3>{html.escape(r.id)} (val {r.score:.3f})</h3>"
                + _figure(_graph(graphs[r.id]), f"graph-{r.id}")
                for r in best)),
            ("instances", "Which inputs each top agent solves",
             _instances(instance_scores(archive, [r.id for r in best], version))),
            ("operators", "Operators", _operators(archive)),
            *([("grid", "MAP-Elites grid", grid)] if (grid := _grid(archive, version)) else []),
            *([("insights", "Insight memory", "<table id='insights'><tr><th>votes</th><th>rule</th></tr>"
                + "".join(f"<tr><td>{v}</td><td style='text-align:left'>{html.escape(t)}</td></tr>"
                          for t, v in memory) + "</table>")] if (memory := archive.insights()) else []),
            ("rl", "RL training", _figure(_rl(archive), "rl")),
            *([("schedule", "Schedule: each step's cost and gain", _schedule(steps))]
              if (steps := recorded(archive)) else []),
            *([("code", "Tool code the agents rewrote", code)] if (code := _code(archive)) else []),
        ]
        title = f"evoagent report: {Path(run_dir).name}"
        summary = (f"{len(list_agents(archive))} agents, {len(archive.generations())} committed "
                   f"generations, weights v{version}; best: "
                   + (f"{best[0].id} val {best[0].score:.3f}" if best else "none scored"))
    body = "".join(
        f'<section id="section-{sid}"><h2>{html.escape(name)}</h2>{content}</section>'
        for sid, name, content in sections
    )
    out.write_text(
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<script type='text/javascript'>{get_plotlyjs()}</script><style>{CSS}</style></head>"
        f"<body><h1>{html.escape(title)}</h1><p>{html.escape(summary)}</p>{body}</body></html>",
        encoding="utf-8",
    )
    return out


CSS = """body{font-family:sans-serif;margin:2em;max-width:1200px}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}
td.ok{background:#c7e9c0}td.fail{background:#fcbba1}section{margin-bottom:3em}"""


def _figure(fig: go.Figure, div_id: str) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id)


def _curves(archive: Archive) -> go.Figure:
    points = curves(archive)
    fig = go.Figure()
    for island in sorted({p.island for p in points}):
        ps = [p for p in points if p.island == island]
        colour = PALETTE[island % len(PALETTE)]
        fig.add_scatter(x=[p.generation for p in ps], y=[p.best for p in ps], mode="lines+markers",
                        name=f"island {island} best", line={"color": colour})
        fig.add_scatter(x=[p.generation for p in ps], y=[p.median for p in ps], mode="lines",
                        name=f"island {island} median", line={"color": colour, "dash": "dash"})
    for phase in rl_phases(archive):
        back = phase.get("rolled_back", False)
        fig.add_vline(x=phase["generation"], line_dash="dot", line_color="red" if back else "grey",
                      annotation_text=f"RL -> v{phase['weights_version']}" + (" rolled back" if back else ""))
    fig.update_layout(xaxis_title="generation", yaxis_title="val score", height=380)
    return fig


def _lineage(archive: Archive, ids: list[str]) -> go.Figure:
    """Ancestors of ``ids``: x = generation, one edge trace per operator, one node trace."""
    edges = {(e.parent, e.child): e for aid in ids for e in lineage_edges(archive, aid)}
    nodes = sorted({n for pair in edges for n in pair} | set(ids))
    recs = {n: archive.agent(n) for n in nodes}
    by_gen: dict[int, list[str]] = {}
    for n in nodes:
        by_gen.setdefault(recs[n].generation, []).append(n)
    pos = {n: (gen, i - (len(ns) - 1) / 2) for gen, ns in by_gen.items() for i, n in enumerate(ns)}
    fig = go.Figure()
    operators = sorted({e.operator for e in edges.values()})
    for k, op in enumerate(operators):
        xs: list[float | None] = []
        ys: list[float | None] = []
        for (p, c), e in edges.items():
            if e.operator == op:
                xs += [pos[p][0], pos[c][0], None]
                ys += [pos[p][1], pos[c][1], None]
        fig.add_scatter(x=xs, y=ys, mode="lines", name=op, line={"color": PALETTE[k % len(PALETTE)], "width": 2})
    score = {e.child: e.child_score for e in edges.values()} | {e.parent: e.parent_score for e in edges.values()}
    fig.add_scatter(
        x=[pos[n][0] for n in nodes], y=[pos[n][1] for n in nodes], mode="markers+text",
        text=[n[:6] for n in nodes], textposition="top center", name="agents",
        marker={"size": [16 if n in ids else 10 for n in nodes], "color": "#333"},
        hovertext=[f"{n} ({recs[n].operator}) val {score.get(n)}" for n in nodes],
    )
    fig.update_layout(xaxis_title="generation", yaxis={"visible": False}, height=420)
    return fig


def _graph(graph: AgentGraph) -> go.Figure:
    """Nodes in layers by longest path from the entry; edges with their probability."""
    g = graph.digraph()
    layer = {n: 0 for n in g}
    for n in nx.topological_sort(g):
        for m in g.successors(n):
            layer[m] = max(layer[m], layer[n] + 1)
    rows: dict[int, list[str]] = {}
    for n in sorted(g):
        rows.setdefault(layer[n], []).append(n)
    pos = {n: (x, i - (len(ns) - 1) / 2) for x, ns in rows.items() for i, n in enumerate(ns)}
    fig = go.Figure()
    xs: list[float | None] = []
    ys: list[float | None] = []
    for e in graph.edges:
        xs += [pos[e.src][0], pos[e.dst][0], None]
        ys += [pos[e.src][1], pos[e.dst][1], None]
        if e.p is not None:
            fig.add_annotation(x=(pos[e.src][0] + pos[e.dst][0]) / 2, y=(pos[e.src][1] + pos[e.dst][1]) / 2,
                               text=f"p={e.p:.2f}", showarrow=False)
    fig.add_scatter(x=xs, y=ys, mode="lines", name="edges", line={"color": "#999"})
    labels = [_label(graph.node(n)) for n in g]
    fig.add_scatter(
        x=[pos[n][0] for n in g], y=[pos[n][1] for n in g], mode="markers+text", name="nodes",
        text=labels, textposition="bottom center",
        marker={"size": 22, "color": [KIND_COLOURS[graph.node(n).kind] for n in g]},
        hovertext=[graph.node(n).model_dump_json()[:400] for n in g],
    )
    fig.update_layout(showlegend=False, xaxis={"visible": False}, yaxis={"visible": False},
                      height=260, margin={"t": 20, "b": 20})
    return fig


def _label(node: LLMNode | ToolNode | LoopNode | VoteNode) -> str:
    if isinstance(node, ToolNode):
        return f"{node.id} [tool: {node.tool}]"
    if isinstance(node, LoopNode):
        return f"{node.id} [loop: {', '.join(node.tools)}]"
    return f"{node.id} [{node.kind}]"


def _instances(scores: dict[str, dict[str, float]]) -> str:
    inputs = sorted({i for per in scores.values() for i in per})
    head = "".join(f"<th>{html.escape(a[:8])}</th>" for a in scores)
    rows = []
    for i in inputs:
        cells = "".join(
            f"<td class='{'ok' if scores[a].get(i, 0.0) >= 1.0 else 'fail'}'>{scores[a].get(i, 0.0):.2f}</td>"
            for a in scores
        )
        rows.append(f"<tr><th>{html.escape(i)}</th>{cells}</tr>")
    solved = "".join(f"<td>{sum(v >= 1.0 for v in scores[a].values())}</td>" for a in scores)
    return (f"<table id='instances'><thead><tr><th>input</th>{head}</tr></thead>"
            f"<tbody>{''.join(rows)}</tbody><tfoot><tr><th>solved</th>{solved}</tr></tfoot></table>")


def _operators(archive: Archive) -> str:
    stats = operator_stats(archive)
    rows = "".join(
        f"<tr><th>{html.escape(s.operator)}</th><td>{s.children}</td><td>{s.valid}</td>"
        f"<td>{s.invalid}</td><td>{s.crashed}</td><td>{s.duplicate}</td><td>{s.improved}</td>"
        f"<td>{s.improvement_rate:.2f}</td><td>{s.tokens}</td></tr>"
        for s in stats
    )
    fig = go.Figure(go.Bar(x=[s.operator for s in stats], y=[s.improvement_rate for s in stats],
                           name="improvement rate"))
    fig.update_layout(yaxis_title="children that beat their parents", height=300)
    return ("<table id='operators'><thead><tr><th>operator</th><th>children</th><th>valid</th>"
            "<th>invalid</th><th>crashed</th><th>duplicate</th><th>improved</th><th>rate</th><th>tokens</th></tr>"
            f"</thead><tbody>{rows}</tbody></table>" + _figure(fig, "operator-rates"))


def _code(archive: Archive, most: int = 20) -> str:
    """The latest ``most`` code changes as diffs against the first parent, then the invalid
    ``rewrite_tool`` children's reasons ('' when no agent changed code)."""
    parts = []
    for a in reversed(archive.agents()):
        owned = a.graph is not None and any(isinstance(n, ToolNode) and n.source for n in a.graph.nodes)
        if not owned or not a.parents or len(parts) >= most:
            continue
        parent = archive.graph(a.parents[0])
        diff = graph_diff(parent, a.graph)  # type: ignore[arg-type]
        text = [c.render() for c in diff.changes if c.field == "source"]
        text += [f"+ new tool {n.id}:\n{n.source}" for n in a.graph.nodes  # type: ignore[union-attr]
                 if isinstance(n, ToolNode) and n.source and n.id in diff.nodes_added]
        if text:
            parts.append(f"<h3>{html.escape(a.id)} ({html.escape(a.operator)} of {html.escape(a.parents[0])}, "
                         f"{html.escape(a.status)})</h3><pre>{html.escape(chr(10).join(text))}</pre>")
    failed = [a for a in archive.agents(operator="rewrite_tool") if a.status != "ok"]
    if failed:
        parts.append("<table id='code-invalid'><tr><th>child</th><th>why it was not kept</th></tr>" + "".join(
            f"<tr><td>{html.escape(a.id)}</td><td style='text-align:left'>{html.escape(a.reason or a.status)}</td></tr>"
            for a in failed[-most:]) + "</table>")
    return "".join(parts)


def _grid(archive: Archive, version: int) -> str:
    """The MAP-Elites grid of a run that selected by it ('' for any other strategy)."""
    from evoagent.evolve.breeding import selection_pool
    from evoagent.evolve.map_elites import grid
    from evoagent.spec.config import RunSpec

    raw = archive.run_spec()
    selection = RunSpec.model_validate_json(raw).evolve.selection if raw else None
    if selection is None or selection.kind != "map_elites":
        return ""
    pool = selection_pool(archive, version)
    axes = selection.descriptors

    def span(axis: int, b: int) -> str:
        edges = axes[axis].bins
        lo = f"{edges[b - 1]:g}" if b > 0 else ""
        hi = f"{edges[b]:g}" if b < len(edges) else ""
        return f"{lo} ≤ x < {hi}" if lo and hi else (f"< {hi}" if hi else f"≥ {lo}")

    rows = "".join(
        "<tr>" + "".join(f"<td>{html.escape(span(i, b))}</td>" for i, b in enumerate(cell))
        + f"<td>{len(members)}</td><td>{html.escape(members[0].id)}</td><td>{members[0].score:.3f}</td></tr>"
        for cell, members in grid(pool, axes).items()
    )
    head = "".join(f"<th>{html.escape(a.name)}</th>" for a in axes)
    return (f"<table id='grid'><thead><tr>{head}<th>agents</th><th>elite</th><th>val</th></tr></thead>"
            f"<tbody>{rows}</tbody></table>")


def _schedule(steps: list[Step]) -> str:
    rows = "".join(
        f"<tr><td>{s.generation}</td><td>{s.kind}</td><td>{s.requests}</td><td>{s.gain:+.3f}</td>"
        f"<td>{'' if s.kept else 'rolled back'}</td></tr>" for s in steps
    )
    return ("<table id='schedule'><tr><th>generation</th><th>step</th><th>completions asked</th>"
            f"<th>best val gain</th><th></th></tr>{rows}</table>")


def _rl(archive: Archive) -> go.Figure:
    steps = [(p["weights_version"], s) for p in rl_phases(archive) for s in p.get("per_step", [])]
    fig = go.Figure()
    for key in ("reward_mean", "accuracy", "loss", "kl"):
        pts = [(i, s[key]) for i, (_, s) in enumerate(steps) if key in s]
        if pts:
            fig.add_scatter(x=[x for x, _ in pts], y=[y for _, y in pts], mode="lines+markers", name=key)
    fig.update_layout(xaxis_title="RL step (all phases)", height=320)
    return fig
