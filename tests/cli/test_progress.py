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
    lines = capsys.readouterr().out.splitlines()
    events = [json.loads(line) for line in lines]
    assert [e["event"] for e in events] == ["stage", "log"]
    assert events[0]["name"] == "gen 1: evaluate 3 children" and events[0]["total"] == 30
    assert events[1]["message"].endswith('"quoted"') and events[1]["t"] >= 0


def test_every_mode_is_a_reporter_and_quiet_prints_nothing(capsys):
    assert set(REPORTERS) == {"rich", "jsonl", "quiet"}
    with reporter("quiet", Console()) as rep:
        rep.stage("x", 1)
        rep.log("y")
    assert capsys.readouterr().out == ""
