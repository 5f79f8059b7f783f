"""The ``evoagent`` command: parse, call one library function, print. Nothing else lives here."""

from __future__ import annotations

import asyncio
import faulthandler
import json
import signal
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.padding import Padding
from rich.table import Column, Table

from evoagent.archive.store import DB_NAME, Archive
from evoagent.errors import BackendError, EvoagentError
from evoagent.graph.io import dump_graph

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
archive_app = typer.Typer(no_args_is_help=True, help="Inspect a run's archive of agent variants.")
app.add_typer(archive_app, name="archive")
console = Console()
errors = Console(stderr=True)


def _fail(e: Exception) -> None:
    """Print ``e`` as one plain error (no markup is read from it, no traceback) and exit 2."""
    errors.print(f"[bold red]error:[/] {escape(str(e))}", soft_wrap=True)
    raise typer.Exit(2)


@app.command()
def run(
    task: Path = typer.Argument(..., help="task.yaml"),
    resume: bool = typer.Option(False, "--resume", help="continue the run's archive"),
    output: str | None = typer.Option(None, help="folder of run archives (default: spec's output)"),
    progress: str = typer.Option(
        "rich", "--progress", help="rich (bars), jsonl (one JSON event per line) or quiet"
    ),
    ray: str | None = typer.Option(
        None, "--ray", help="evaluate candidates on Ray workers: a cluster ADDRESS, or 'local' "
        "(or nothing) to start one for this run (needs evoagent-ml\\[distributed])",
    ),
    ray_workers: int = typer.Option(2, "--ray-workers", min=1, help="Ray workers, each with a backend"),
    memory: Path | None = typer.Option(
        None, "--memory", help="start the insight memory from FROM_RUN, a run of the same task"
    ),
) -> None:
    """Evolve agents (and train the policy) for TASK; the archive lands in OUTPUT/NAME."""
    from evoagent import runner
    from evoagent.progress import REPORTERS, reporter

    if progress not in REPORTERS:
        _fail(EvoagentError(f"--progress: unknown mode {progress!r}; known: {sorted(REPORTERS)}"))
    cluster = None
    if ray is not None:
        cluster = runner.RayOptions(None if ray == "local" else ray, ray_workers)
    again = f"evoagent run {task}" + (f" --output {output}" if output else "") + (
        f" --ray {ray} --ray-workers {ray_workers}" if ray else "") + " --resume"
    spec = None
    try:
        if memory is not None and resume:
            raise EvoagentError("--memory starts a new run's insights; a resumed run keeps its own")
        spec = runner.prepare(task, output=output, resume=resume)
        insights = runner.load_memory(memory, spec) if memory is not None else None
        with reporter(progress, console) as rep:  # type: ignore[arg-type]
            result = asyncio.run(runner.run(spec, rep, cluster, insights))
    except BackendError as e:  # a model server that went away mid-run: the archive is intact
        if spec is not None and (spec.run_dir / DB_NAME).exists():
            errors.print(f"[bold red]error:[/] {escape(str(e))}\nevery finished generation is "
                         f"archived; once the backend is back, continue with: {escape(again)}",
                         soft_wrap=True)
            raise typer.Exit(2) from None
        _fail(e)
    except EvoagentError as e:
        _fail(e)
    except KeyboardInterrupt:
        errors.print("[yellow]interrupted[/]: every finished generation is archived; "
                     f"continue with: {escape(again)}")
        raise typer.Exit(130) from None
    test = f"{result.test:.3f}" if result.test is not None else "-"
    console.print(
        f"best agent [bold]{result.best_id}[/]: val {result.best_val:.3f} "
        f"(best seed {result.seed_val:.3f}), test {test}, weights v{result.weights_version}\n"
        f"archive: {result.run_dir}  best graph: {result.run_dir / 'best.yaml'}"
    )


@app.command()
def report(
    run_dir: Path = typer.Argument(..., help="the run folder, e.g. populations/<name>"),
    out: Path | None = typer.Option(None, "-o", "--out", help="HTML file (default: RUN/report.html)"),
    top: int = typer.Option(5, help="how many of the best agents to draw and compare"),
) -> None:
    """Write one self-contained HTML report of the run (opens offline in any browser)."""
    from evoagent.report import write_report

    try:
        path = write_report(run_dir, out, top)
    except EvoagentError as e:
        _fail(e)
    console.print(f"wrote {path}")


def _open(run_dir: Path) -> Archive:
    try:
        return Archive(run_dir, write=False)
    except EvoagentError as e:
        _fail(e)
        raise


def _json(data: object) -> None:
    """Machine-readable output: one JSON document on stdout, nothing else."""
    typer.echo(json.dumps(data, indent=2, default=str))


def _score(score: float | None, stage: str | None) -> str:
    if score is None:
        return "-"
    return f"{score:.3f}" + (" (mb)" if stage == "minibatch" else "")


RUN = typer.Argument(..., help="the run folder, e.g. populations/<name>")
AS_JSON = typer.Option(False, "--json", help="print JSON instead of a table")


@archive_app.command("list")
def list_(
    run_dir: Path = RUN,
    sort: str = typer.Option("score", help="score | generation | id"),
    top: int | None = typer.Option(None, help="only the first N rows"),
    status: str | None = typer.Option(None, help="ok | invalid | crashed | duplicate"),
    island: int | None = typer.Option(None, help="only this island"),
    generation: int | None = typer.Option(None, help="only agents made in this generation"),
    weights_version: int | None = typer.Option(None, "--weights-version",
                                               help="score under this version (default: newest)"),
    as_json: bool = AS_JSON,
) -> None:
    """Variants with their val score: id, generation, island, operator, parents, status."""
    from typing import get_args

    from evoagent.archive.views import ListFilter, Sort, list_agents

    if sort not in get_args(Sort):
        _fail(EvoagentError(f"--sort: unknown order {sort!r}; known: {sorted(get_args(Sort))}"))
    with _open(run_dir) as a:
        rows = list_agents(a, ListFilter(sort, top, status, island, generation, weights_version))  # type: ignore[arg-type]
    if as_json:
        _json([r.to_dict() for r in rows])
        return
    table = Table("gen", "island", "operator", "parents", "status", "val", "weights",
                  title=f"{run_dir}: {len(rows)} agents")
    table.columns.insert(0, Column("id", no_wrap=True, min_width=12))  # ids are what users copy
    for r in rows:
        state = r.status if r.status == "ok" else f"{r.status}: {(r.reason or '')[:50]}"
        table.add_row(r.id, str(r.generation), str(r.island), r.operator,
                      ",".join(p[:8] for p in r.parents) or "-", escape(state),
                      _score(r.score, r.stage), f"v{r.weights_version}")
    console.print(table)


@archive_app.command()
def show(run_dir: Path = RUN, agent_id: str = typer.Argument(..., help="id or unique prefix"),
         as_json: bool = AS_JSON) -> None:
    """One variant: provenance, status and reason, every evaluation, cost, and its graph."""
    from evoagent.archive.views import agent_detail

    with _open(run_dir) as a:
        try:
            d = agent_detail(a, agent_id)
        except EvoagentError as e:
            _fail(e)
    if as_json:
        _json(d.to_dict())
        return
    r = d.record
    console.print(f"[bold]{r.id}[/] gen {r.generation} island {r.island} via {r.operator} "
                  f"from {list(r.parents) or '-'}; children {d.children or '-'}")
    console.print(f"status: {r.status}" + (f" ({escape(r.reason)})" if r.reason else ""))
    table = Table("split", "stage", "weights", "score", "n", "tokens", "seconds", "generation")
    for e in d.evaluations:
        weights = f"v{e.weights_version}" + (" (rolled back)" if e.weights_version in d.rolled_back else "")
        table.add_row(e.split, e.stage, weights, f"{e.score:.3f}", str(e.n),
                      str(e.tokens), f"{e.seconds:.1f}", str(e.generation))
    console.print(table)
    console.print(f"cost: {d.cost['tokens']} tokens, {d.cost['seconds']:.1f} s")
    if r.graph is not None:
        console.print(dump_graph(r.graph), markup=False, highlight=False)


@archive_app.command()
def diff(run_dir: Path = RUN, a_id: str = typer.Argument(..., help="the 'before' agent"),
         b_id: str = typer.Argument(..., help="the 'after' agent"), as_json: bool = AS_JSON) -> None:
    """What changed from A to B: nodes, edges, each changed field, prompts as unified diffs."""
    from evoagent.graph.diff import graph_diff

    with _open(run_dir) as a:
        try:
            ga, gb = a.agent(a_id), a.agent(b_id)
        except EvoagentError as e:
            _fail(e)
    for r in (ga, gb):
        if r.graph is None:
            _fail(EvoagentError(f"{r.id} has no graph (it is {r.status}: {r.reason})"))
    d = graph_diff(ga.graph, gb.graph)  # type: ignore[arg-type]
    if as_json:
        _json({"a": ga.id, "b": gb.id, **d.to_dict()})
        return
    console.print(f"[bold]{ga.id}[/] -> [bold]{gb.id}[/] ({gb.operator})")
    if d.empty:
        console.print("(identical graphs)")
    for n in d.nodes_added:
        console.print(f"[green]+ node {n}[/]: {gb.graph.node(n).kind}")  # type: ignore[union-attr]
    for n in d.nodes_removed:
        console.print(f"[red]- node {n}[/]")
    for e in d.edges_added:
        console.print(f"[green]+ edge {e[0]} -> {e[1]}[/]")
    for e in d.edges_removed:
        console.print(f"[red]- edge {e[0]} -> {e[1]}[/]")
    for c in d.ends + d.changes:
        console.print(f"[yellow]~ {c.node}.{c.field}[/]:")
        console.print(c.render(), markup=False, highlight=False)


@archive_app.command()
def lineage(run_dir: Path = RUN, agent_id: str = typer.Argument(..., help="id or unique prefix"),
            as_json: bool = AS_JSON) -> None:
    """The variant's ancestors as a tree, each edge with its operator and the score change."""
    from rich.tree import Tree

    from evoagent.archive.views import lineage_edges

    with _open(run_dir) as a:
        try:
            root = a.resolve(agent_id)
            edges = lineage_edges(a, root)
            ops = {r.id: r.operator for r in map(a.agent, {root, *(e.parent for e in edges)})}
        except EvoagentError as e:
            _fail(e)
    if as_json:
        _json({"id": root, "edges": [e.__dict__ for e in edges]})
        return
    parents: dict[str, list] = {}
    for e in edges:
        parents.setdefault(e.child, []).append(e)
    score = {e.child: e.child_score for e in edges} | {e.parent: e.parent_score for e in edges}
    tree = Tree(f"[bold]{root}[/] val {_score(score.get(root), 'full')}")
    shown: set[str] = set()

    def grow(node: Tree, child: str) -> None:
        for e in parents.get(child, []):
            delta = ("" if e.child_score is None or e.parent_score is None
                     else f" ({e.child_score - e.parent_score:+.3f})")
            label = (f"{e.parent} val {_score(e.parent_score, 'full')} "
                     f"--[{e.operator}{delta}]--> {e.child[:8]}  ({ops.get(e.parent, '?')})")
            branch = node.add(escape(label))
            if e.parent not in shown:
                shown.add(e.parent)
                grow(branch, e.parent)

    grow(tree, root)
    console.print(tree)


@archive_app.command()
def export(
    run_dir: Path = RUN, agent_id: str = typer.Argument(..., help="id or unique prefix"),
    out: Path = typer.Argument(..., help="folder to write the agent to"),
) -> None:
    """Write the agent to OUT: graph.yaml, its LoRA adapter (peft format), agent.json, run.py."""
    from evoagent import replay

    with _open(run_dir) as a:
        try:
            agent = replay.archived_agent(a, agent_id)
            written = replay.export(agent, out)
        except EvoagentError as e:
            _fail(e)
    for p in written:
        console.print(f"wrote {p}")
    console.print(f"run it: python {out / 'run.py'} \"<your input>\"  (weights v{agent.weights_version})")


@archive_app.command()
def replay(
    run_dir: Path = RUN, agent_id: str = typer.Argument(..., help="id or unique prefix"),
    text: str = typer.Option(
        ..., "--input", help="the input to run the agent on, or the id of one of the run's "
        "examples (needed for environments: e.g. FrozenLake-v0-train-5)"),
    as_json: bool = AS_JSON,
) -> None:
    """Run the agent once on --input with its own weights and print its trajectory, step by step."""
    from evoagent import replay as rp

    with _open(run_dir) as a:
        try:
            agent = rp.archived_agent(a, agent_id)
        except EvoagentError as e:
            _fail(e)
    try:
        traj = asyncio.run(rp.run_once(agent, text))
    except EvoagentError as e:
        _fail(e)
    if as_json:
        typer.echo(traj.to_json())
        return
    console.print(f"[bold]{agent.id}[/] (weights v{agent.weights_version}) on: {escape(text)}")
    for i, step in enumerate(traj.steps, 1):
        if step.kind == "llm":
            console.print(f"[cyan]{i}. llm {step.node}[/] ({len(step.completion_ids)} tokens, "
                          f"{step.finish_reason})")
            console.print(Padding(escape(step.messages[-1]["content"]), (0, 0, 0, 4)), style="dim")
            console.print(Padding(escape(step.text), (0, 0, 0, 4)))
        else:
            state = "ok" if step.ok else f"error: {step.error}"
            console.print(f"[magenta]{i}. tool {step.node}[/] {step.tool}({escape(step.argument)!r}) "
                          f"-> {escape(step.output)!r} [{escape(state)}]")
    console.print(f"[bold]output:[/] {escape(traj.output)}"
                  + (f"  [red]error: {escape(traj.error)}[/]" if traj.error else ""))


def with_bare_ray(args: list[str]) -> list[str]:
    """``args`` with a bare ``--ray`` (last, or followed by another option) read as ``--ray
    local``: typer options cannot take an optional value."""
    out = list(args)
    for i, a in enumerate(out):
        if a == "--ray" and (i + 1 == len(out) or out[i + 1].startswith("-")):
            out.insert(i + 1, "local")
    return out


def main() -> None:
    """The ``evoagent`` command. ``kill -USR1`` on it prints every thread's stack to stderr (and
    it goes on): what a run that seems stuck, or slow to stop, is doing."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    app(args=with_bare_ray(sys.argv[1:]), prog_name="evoagent")

