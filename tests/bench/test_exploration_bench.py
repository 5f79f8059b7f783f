"""bench/exploration.py: the summary on synthetic cells with a known answer, and both games
load offline as sparse (win-only) boards."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import cells  # noqa: E402
import exploration  # noqa: E402


def test_the_summary_compares_the_arms_paired_by_board():
    boards = [f"b{i}" for i in range(16)]
    got = {}
    for game in exploration.GAMES:
        for seed in exploration.SEEDS:
            for arm in exploration.ARMS:
                won = 0.5 if arm == "count" else 0.25  # the bonus wins a quarter more on every board
                got[cells.Cell(game, arm, seed)] = {
                    "per_input": dict.fromkeys(boards, won), "before": dict.fromkeys(boards, 0.25),
                    "train_success": [0.0, 0.1], "group_signal_share": [0.0, 0.25],
                    "shaped_group_signal_share": [1.0, 1.0] if arm == "count" else [0.0, 0.25],
                    "steps_trained": 2.0 if arm == "count" else 1.0, "rollouts": 192,
                }
    figures = exploration.summarize(got) | {"commit": "f" * 40}
    lake = figures["games"]["frozenlake"]
    assert lake["count_minus_none"] == [0.25, 0.25]
    assert lake["rows"]["count"]["shaped_group_signal_share"] == 1.0
    assert lake["rows"]["none"]["group_signal_share"] == 0.125
    assert "| frozenlake | count - none | | [+0.250, +0.250] |" in exploration.markdown(figures)


@pytest.mark.parametrize("game", sorted(exploration.GAMES))
def test_each_game_loads_offline_as_win_only_boards(game):
    pytest.importorskip("textarena")
    from evoagent.spec.config import DatasetConfig
    from evoagent.tasks.datasets import load_examples

    env_id = exploration.GAMES[game][0]
    boards = load_examples(DatasetConfig(kind="textarena", name=env_id, size=2, options={"partial_credit": False}),
                           7, ROOT)
    assert len(boards) == 2 and all(b.meta["partial_credit"] is False for b in boards)


def test_summarize_writes_the_summary_from_kept_cells_and_runs_none(tmp_path, monkeypatch):
    """``--summarize`` builds exploration.json/.md from the cells of one commit (as after a
    campaign that ran at an older commit), without running a cell."""
    import json
    import subprocess

    monkeypatch.delenv(cells.LAND, raising=False)
    head = cells.commit()[0]
    monkeypatch.setattr(cells, "commit", lambda: (head, False))  # cells of a clean checkout at HEAD
    folder = tmp_path / "exploration"
    boards = [f"b{i}" for i in range(4)]
    for cell in cells.grid(exploration.GAMES, exploration.ARMS, exploration.SEEDS):
        won = 0.5 if cell.row == "count" else 0.0
        cells.write(folder, cell, {"per_input": dict.fromkeys(boards, won), "before": dict.fromkeys(boards, 0.0),
                                   "train_success": [0.0], "group_signal_share": [0.0],
                                   "shaped_group_signal_share": [0.5], "steps_trained": 1.0, "rollouts": 192},
                    "python bench/exploration.py", 1.0)
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "exploration.py"), "--results", str(folder),
                           "--summarize"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    figures = json.loads((tmp_path / "exploration.json").read_text())
    assert figures["games"]["guess_number"]["count_minus_none"] == [0.5, 0.5]
    assert figures["campaign"]["commit"] == figures["commit"]
    assert "| guess_number | count - none |" in (tmp_path / "exploration.md").read_text()
