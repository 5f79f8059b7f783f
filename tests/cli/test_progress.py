"""What ``evoagent run --progress jsonl`` prints: one parseable event per line, nothing else."""

from __future__ import annotations

import json

from rich.console import Console

from evoagent.progress import REPORTERS, reporter


def test_jsonl_events_parse_and_carry_stage_and_log(capsys):
    with reporter("jsonl", Console()) as rep:
        rep.stage("gen 1: evaluate 3 children", 30)
        rep.advance()
        rep.log('gen 1/4 done: best val 0.5 "quoted"')
        rep.search(1, 4, "best val 0.5")
    lines = capsys.readouterr().out.splitlines()
    events = [json.loads(line) for line in lines]
    assert [e["event"] for e in events] == ["stage", "log", "generation"]
    assert events[2]["generation"] == 1 and events[2]["total"] == 4
    assert events[0]["name"] == "gen 1: evaluate 3 children" and events[0]["total"] == 30
    assert events[1]["message"].endswith('"quoted"') and events[1]["t"] >= 0


def test_every_mode_is_a_reporter_and_quiet_prints_nothing(capsys):
    assert set(REPORTERS) == {"rich", "jsonl", "quiet"}
    with reporter("quiet", Console()) as rep:
        rep.stage("x", 1)
        rep.log("y")
    assert capsys.readouterr().out == ""


def test_rich_keeps_a_generations_bar_across_stages():
    import io

    console = Console(file=io.StringIO(), force_terminal=True, width=120)
    with reporter("rich", console) as rep:
        rep.search(0, 4, "best val 0.062")
        rep.stage("gen 1: evaluate 4 children", 128)
        rep.search(1, 4, "best val 0.406")
        rep.stage("gen 2: evaluate 4 children", 128)
        tasks = {t.description: t for t in rep.progress.tasks}
    bar = next(t for d, t in tasks.items() if d.startswith("generations"))
    assert bar.completed == 1 and bar.total == 4 and "0.406" in bar.description
    assert sum(d.startswith("gen ") for d in tasks) == 1  # the stage bar is replaced, not stacked
