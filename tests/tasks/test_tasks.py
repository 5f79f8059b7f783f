"""Datasets, splits and rewards: deterministic data; a broken reward is a 0 with a reason."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from evoagent.errors import SpecError
from evoagent.spec.config import DatasetConfig, RewardConfig, SplitsConfig, TaskConfig
from evoagent.tasks import Example, get_extractor, load_examples, score, split
from evoagent.tasks.datasets import task_data


def rg_examples(size: int = 30, seed: int = 0) -> list[Example]:
    cfg = DatasetConfig(kind="reasoning_gym", name="basic_arithmetic", size=size,
                        options={"min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 2})
    return load_examples(cfg, seed, Path("."))


def test_reasoning_gym_data_is_seeded_and_self_scoring():
    a, b = rg_examples(), rg_examples()
    assert [e.input for e in a] == [e.input for e in b]
    assert [e.input for e in rg_examples(seed=1)] != [e.input for e in a]
    ex = a[0]
    assert asyncio.run(score(ex.answer, ex, RewardConfig(kind="reasoning_gym", extract="raw"))) == (1.0, None, None)


def test_splits_are_disjoint_and_reproducible():
    ex = rg_examples(30)
    cfg = SplitsConfig(train=10, val=8, test=6)
    s1, s2 = split(ex, cfg, 0), split(ex, cfg, 0)
    assert {k: [e.id for e in v] for k, v in s1.items()} == {k: [e.id for e in v] for k, v in s2.items()}
    ids = [e.id for part in s1.values() for e in part]
    assert len(ids) == len(set(ids)) == 24
    with pytest.raises(SpecError, match=r"task\.splits: train\+val\+test = 100"):
        split(ex, SplitsConfig(train=50, val=25, test=25), 0)


def test_a_repeated_question_lands_in_one_split_only():
    """200 questions exist at two one-digit terms and + or -: 300 examples repeat many."""
    cfg = DatasetConfig(kind="reasoning_gym", name="chain_sum", size=300,
                        options={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1})
    ex = load_examples(cfg, 0, Path("."))
    parts = split(ex, SplitsConfig(train=40, val=20, test=30), 0)
    questions = [e.input for part in parts.values() for e in part]
    assert len(questions) == len(set(questions)) == 90
    with pytest.raises(SpecError, match=r"distinct questions \(300 examples\)"):
        split(ex, SplitsConfig(train=150, val=50, test=50), 0)
    boards = [Example(f"lake-{s}", "the same first board", "", {"seed": s}) for s in (1, 2)]
    parts = split(boards, SplitsConfig(train=0, val=1, test=1), 0)  # episodes differ by seed
    assert {e.id for part in parts.values() for e in part} == {"lake-1", "lake-2"}


def chain_task(**splits) -> TaskConfig:
    data = DatasetConfig(kind="reasoning_gym", name="chain_sum", size=400,
                         options={"min_terms": 3, "max_terms": 3, "min_digits": 1, "max_digits": 1})
    return TaskConfig(description="sums", dataset=data, splits=SplitsConfig(**splits))


def test_a_test_seed_keeps_one_test_set_across_run_seeds_and_redraws_train_and_val():
    task = chain_task(train=40, val=20, test=50, test_seed=7)
    runs = [task_data(task, seed, Path("."))[1] for seed in (0, 1, 2)]
    tests = [[e.input for e in r["test"]] for r in runs]
    assert tests[0] == tests[1] == tests[2]  # the same inputs, in the same order
    assert len({tuple(e.input for e in r["val"]) for r in runs}) == 3
    for r in runs:
        questions = [e.input for part in r.values() for e in part]
        assert len(questions) == len(set(questions)) == 110  # disjoint by question
    plain = [task_data(chain_task(train=40, val=20, test=50), seed, Path("."))[1] for seed in (0, 1)]
    assert [e.input for e in plain[0]["test"]] != [e.input for e in plain[1]["test"]]


def test_excluded_questions_are_in_no_split(tmp_path):
    task = chain_task(train=40, val=20, test=50)
    before = task_data(task, 0, tmp_path)[1]
    seen = [e.input for e in before["test"][:10]] + [e.input for e in before["val"][:5]]
    lines = [json.dumps({"question": q}) for q in seen[:8]] + [json.dumps({"input": q}) for q in seen[8:]]
    (tmp_path / "screened.jsonl").write_text("\n".join(lines) + "\n")
    after = task_data(chain_task(train=40, val=20, test=50, exclude="screened.jsonl"), 0, tmp_path)[1]
    used = {e.input for part in after.values() for e in part}
    assert not used & set(seen) and len(used) == 110
    with pytest.raises(SpecError, match=r"\(15 of them were left out by task\.splits\.exclude\)"):
        task_data(chain_task(train=400, val=20, test=50, exclude="screened.jsonl"), 0, tmp_path)


@pytest.mark.parametrize(("body", "says"), [
    (None, r"task\.splits\.exclude: .*missing\.jsonl does not exist"),
    ("{\"question\": \"ok\"}\nnot json\n", r"task\.splits\.exclude: .*:2: invalid JSON"),
    ("{\"answer\": \"3\"}\n", r"task\.splits\.exclude: .*:1: needs an 'input' or 'question' string"),
])
def test_a_bad_exclude_file_names_the_field_and_line(tmp_path, body, says):
    if body is not None:
        (tmp_path / "missing.jsonl").write_text(body)
    with pytest.raises(SpecError, match=says):
        task_data(chain_task(train=4, val=4, test=4, exclude="missing.jsonl"), 0, tmp_path)


def test_jsonl_dataset_errors_name_the_line(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"input": "1+1", "answer": "2"}\n{broken\n')
    with pytest.raises(SpecError, match=r"d\.jsonl:2: invalid JSON"):
        load_examples(DatasetConfig(kind="jsonl", path="d.jsonl"), 0, tmp_path)
    p.write_text('{"question": "1+1", "answer": 2, "id": "q1"}\n')
    (ex,) = load_examples(DatasetConfig(kind="jsonl", path="d.jsonl"), 0, tmp_path)
    assert (ex.id, ex.input, ex.answer) == ("q1", "1+1", "2")


@pytest.mark.parametrize(
    ("text", "expected"),
    [("The answer is 1,234.", "1234"), ("so 7.50 total", "7.5"), ("-12 then 3", "3"), ("none", "")],
)
def test_last_number(text, expected):
    assert get_extractor("last_number")(text) == expected


def test_numeric_reward_reads_the_final_number():
    ex = Example("1", "Calculate 95 - 21.", "74")
    cfg = RewardConfig()
    assert asyncio.run(score("95 - 21 = 74", ex, cfg)) == (1.0, None, None)
    assert asyncio.run(score("Answer: 75", ex, cfg)) == (0.0, None, None)


def bad_reward(answer, example):
    raise ValueError("boom")


def slow_reward(answer, example):
    time.sleep(1.0)
    return 1.0


def nan_reward(answer, example):
    return float("nan")


@pytest.mark.parametrize(
    ("ref", "reason"),
    [("bad_reward", "reward raised ValueError: boom"), ("slow_reward", "timed out"),
     ("nan_reward", "returned nan")],
)
def test_a_failing_reward_scores_zero_with_the_reason(ref, reason):
    cfg = RewardConfig(kind="python", ref=f"{__name__}:{ref}", timeout_s=0.3)
    value, err, _ = asyncio.run(score("1", Example("1", "q", "1"), cfg))
    assert value == 0.0 and reason in err


def graded_reward(answer, example):
    """Partial credit with words on what was wrong, as GEPA's evaluators give it."""
    if answer == example.answer:
        return 1.0
    return 0.25, f"off by {abs(float(answer) - float(example.answer)):g}"


def test_a_reward_may_say_what_was_wrong_and_the_trajectory_keeps_it():
    from evoagent.execute.evaluate import run_and_score
    from evoagent.execute.executor import ExecContext
    from evoagent.graph import load_graph
    from evoagent.llm.scripted import ScriptedBackend
    from evoagent.tools import ToolContext

    cfg = RewardConfig(kind="python", ref=f"{__name__}:graded_reward")
    ex = Example("1", "Calculate 95 - 21.", "74")
    assert asyncio.run(score("70", ex, cfg)) == (0.25, None, "off by 4")
    assert asyncio.run(score("74", ex, cfg)) == (1.0, None, None)
    graph = load_graph(Path(__file__).resolve().parents[2] / "graphs" / "direct.yaml")
    ctx = ExecContext(ScriptedBackend(handler=lambda r: "It is 71"), ToolContext(), seed=0)
    traj = asyncio.run(run_and_score(graph, ex, ctx, cfg))
    assert (traj.reward, traj.feedback, traj.error) == (0.25, "off by 3", None)
    assert type(traj).from_json(traj.to_json()).feedback == "off by 3"  # archived with it
