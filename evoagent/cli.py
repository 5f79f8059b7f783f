"""The ``evoagent`` command: parse, call one library function, print. Nothing else lives here."""

from __future__ import annotations

import asyncio
import difflib
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Column, Table

from evoagent.archive.store import Archive
from evoagent.errors import EvoagentError
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
) -> None:
    """Evolve agents (and train the policy) for TASK; the archive lands in OUTPUT/NAME."""
    from evoagent import runner
    from evoagent.progress import REPORTERS, reporter

    if progress not in REPORTERS:
        _fail(EvoagentError(f"--progress: unknown mode {progress!r}; known: {sorted(REPORTERS)}"))
    try:
        spec = runner.prepare(task, output=output, resume=resume)
        with reporter(progress, console) as rep:  # type: ignore[arg-type]
            result = asyncio.run(runner.run(spec, rep))
    except EvoagentError as e:
        _fail(e)
    except KeyboardInterrupt:
        again = f"evoagent run {task}" + (f" --output {output}" if output else "") + " --resume"
        errors.print("[yellow]interrupted[/]: every finished generation is archived; "
                     f"continue with: {escape(again)}")
        raise typer.Exit(130) from None
    test = f"{result.test:.3f}" if result.test is not None else "-"
    console.print(
        f"best agent [bold]{result.best_id}[/]: val {result.best_val:.3f} "
        f"(best seed {result.seed_val:.3f}), test {test}, weights v{result.weights_version}\n"
        f"archive: {result.run_dir}  best graph: {result.run_dir / 'best.yaml'}"
    )


def _open(run_dir: Path) -> Archive:
    try:
        return Archive(run_dir, write=False)
    except EvoagentError as e:
        _fail(e)
        raise


@archive_app.command("list")
def list_(run_dir: Path = typer.Argument(..., help="populations/<run>")) -> None:
    """Every variant: id, generation, island, operator, parents, status, val score."""
    with _open(run_dir) as a:
        table = Table("gen", "island", "operator", "parents", "status", "val", "weights")
        table.columns.insert(0, Column("id", no_wrap=True, min_width=12))  # ids are what users copy
        for r in a.agents():
            evals = [e for e in a.evaluations(r.id) if e.split == "val"]
            last = evals[-1] if evals else None
            val = f"{last.score:.3f}{'' if last.stage == 'full' else ' (mb)'}" if last else "-"
            table.add_row(r.id, str(r.generation), str(r.island), r.operator,
                          ",".join(r.parents) or "-", r.status if r.status == "ok" else
                          f"{r.status}: {(r.reason or '')[:50]}", val,
                          f"v{last.weights_version}" if last else "-")
        console.print(table)


@archive_app.command()
def show(run_dir: Path, agent_id: str) -> None:
    """One variant's graph, provenance and evaluations."""
    with _open(run_dir) as a:
        try:
            r = a.agent(agent_id)
        except EvoagentError as e:
            _fail(e)
        console.print(f"[bold]{r.id}[/] gen {r.generation} island {r.island} via {r.operator} "
                      f"from {list(r.parents)}: {r.status} {r.reason or ''}")
        for e in a.evaluations(r.id):
            console.print(f"  {e.split}/{e.stage} v{e.weights_version}: {e.score:.3f} "
                          f"on {e.n} ({e.tokens} tokens, {e.seconds:.1f}s)")
        if r.graph is not None:
            console.print(dump_graph(r.graph), markup=False, highlight=False)


@archive_app.command()
def diff(run_dir: Path, a_id: str, b_id: str) -> None:
    """Unified diff of two variants' graphs."""
    with _open(run_dir) as a:
        try:
            ga, gb = a.agent(a_id), a.agent(b_id)
        except EvoagentError as e:
            _fail(e)
        lines = difflib.unified_diff(
            dump_graph(ga.graph).splitlines() if ga.graph else [],
            dump_graph(gb.graph).splitlines() if gb.graph else [],
            ga.id, gb.id, lineterm="",
        )
        console.print("\n".join(lines) or "(identical)", markup=False, highlight=False)


@archive_app.command()
def lineage(run_dir: Path, agent_id: str) -> None:
    """The variant and its ancestors back to the seeds."""
    with _open(run_dir) as a:
        try:
            chain = a.lineage(agent_id)
        except EvoagentError as e:
            _fail(e)
        for r in chain:
            best = max((e.score for e in a.evaluations(r.id) if e.split == "val" and e.stage == "full"),
                       default=None)
            score = f"{best:.3f}" if best is not None else "-"
            console.print(f"{r.id}  gen {r.generation}  {r.operator:<20} val {score}  "
                          f"parents {','.join(r.parents) or '-'}")


@archive_app.command()
def export(
    run_dir: Path, agent_id: str,
    out: Path | None = typer.Option(None, "-o", "--out", help="file to write (default: stdout)"),
) -> None:
    """Write a variant's graph as YAML, ready to be a seed in another task.yaml."""
    with _open(run_dir) as a:
        try:
            r = a.agent(agent_id)
        except EvoagentError as e:
            _fail(e)
        if r.graph is None:
            _fail(EvoagentError(f"{r.id} has no graph ({r.status}: {r.reason})"))
        text = dump_graph(r.graph.model_copy(update={"name": f"{r.operator}-{r.id}"}))
        if out is None:
            console.print(text, markup=False, highlight=False)
        else:
            out.write_text(text)
            console.print(f"wrote {out}")
