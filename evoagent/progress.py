"""How ``evoagent run`` shows a search as it goes: rich bars, JSON lines for logs, or quiet.

Each is a ``Reporter`` (``evolve.loop``): ``stage`` starts a counted stage (an evaluation, an
RL phase), ``advance`` counts one unit of it, ``log`` reports an event. The JSON-lines form
writes one object per line, ``{"t": seconds, "event": "stage"|"log", ...}``, for log files
and for tools that follow a run (it is also how the crash tests know which phase they hit).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Literal

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from evoagent.evolve.hooks import NullReporter, Reporter

Mode = Literal["rich", "jsonl", "quiet"]


class RichReporter:
    """One progress bar per stage (with an ETA) and the log lines above it."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.task: int | None = None
        self.overall: int | None = None  # the generations bar stays while stages come and go

    def stage(self, name: str, total: int) -> None:
        if self.task is not None:
            self.progress.remove_task(self.task)
        self.task = self.progress.add_task(escape(name), total=total)

    def advance(self) -> None:
        if self.task is not None:
            self.progress.advance(self.task)

    def log(self, message: str) -> None:
        self.progress.console.print(message, markup=False, highlight=False)

    def search(self, generation: int, total: int, summary: str) -> None:
        text = escape(f"generations ({summary})")
        if self.overall is None:
            self.overall = self.progress.add_task(text, total=total, completed=generation)
        else:
            self.progress.update(self.overall, description=text, completed=generation)


class JsonlReporter:
    """One JSON object per event on stdout, flushed at once (a killed run loses no line)."""

    def __init__(self) -> None:
        self.start = time.monotonic()

    def _emit(self, **fields: object) -> None:
        fields = {"t": round(time.monotonic() - self.start, 3), **fields}
        sys.stdout.write(json.dumps(fields) + "\n")
        sys.stdout.flush()

    def stage(self, name: str, total: int) -> None:
        self._emit(event="stage", name=name, total=total)

    def advance(self) -> None: ...

    def log(self, message: str) -> None:
        self._emit(event="log", message=message)

    def search(self, generation: int, total: int, summary: str) -> None:
        self._emit(event="generation", generation=generation, total=total, summary=summary)


@contextmanager
def _rich(console: Console) -> Iterator[Reporter]:
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        yield RichReporter(progress)


@contextmanager
def _jsonl(console: Console) -> Iterator[Reporter]:
    yield JsonlReporter()


@contextmanager
def _quiet(console: Console) -> Iterator[Reporter]:
    yield NullReporter()


REPORTERS: dict[str, Callable[[Console], AbstractContextManager[Reporter]]] = {
    "rich": _rich, "jsonl": _jsonl, "quiet": _quiet,
}


def reporter(mode: Mode, console: Console) -> AbstractContextManager[Reporter]:
    """The reporter of ``mode``, as a context manager (rich bars must be closed)."""
    return REPORTERS[mode](console)
