"""Rewards: score an extracted answer against an example, in [0, 1] (higher is better).

A registry of ``fn(answer, example, cfg) -> float``. ``score`` is the one entry point the
executor uses: it applies the extractor, runs the reward under ``timeout_s`` and turns a
raising, hanging or out-of-range reward into score 0 plus a reason, so one bad example never
stops a run. Built-in rewards run in a thread; the user's own (``kind: python``) runs in a
worker process (``evoagent.usercode``) that is killed when it hangs.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Callable

from evoagent.errors import SpecError, UserCodeError
from evoagent.registry import Registry
from evoagent.spec.config import RewardConfig
from evoagent.tasks.datasets import Example, import_ref
from evoagent.tasks.extract import get_extractor
from evoagent.usercode import UserCode

RewardFn = Callable[[str, Example, RewardConfig], float]
_REGISTRY: Registry[RewardFn] = Registry("reward", SpecError, field="task.reward.kind")
reward = _REGISTRY.register  # ``@reward("name")``: register ``fn(answer, example, cfg) -> float``
known_rewards = _REGISTRY.names
get_reward = _REGISTRY.get


async def score(
    output: str, example: Example, cfg: RewardConfig, user: UserCode | None = None
) -> tuple[float, str | None]:
    """(reward, error): the reward of ``output``; 0.0 and the reason if the reward failed."""
    fn = get_reward(cfg.kind)
    extract = get_extractor(cfg.extract)
    try:
        answer = extract(output)
        if cfg.kind == "python" and user is not None:
            value = await _user_reward(answer, example, cfg, user)
        else:
            value = await asyncio.wait_for(asyncio.to_thread(fn, answer, example, cfg), cfg.timeout_s)
    except TimeoutError:
        return 0.0, f"reward timed out after {cfg.timeout_s}s"
    except UserCodeError as e:
        return 0.0, str(e)
    except Exception as e:  # the user's reward is a candidate boundary: its failure is data
        return 0.0, f"reward raised {type(e).__name__}: {e}"
    try:
        value = float(value)
    except (TypeError, ValueError):
        return 0.0, f"reward returned {value!r}, not a number"
    if not math.isfinite(value):
        return 0.0, f"reward returned {value}"
    return min(1.0, max(0.0, value)), None


async def _user_reward(answer: str, example: Example, cfg: RewardConfig, user: UserCode) -> object:
    """The user's ``module:function(answer, example)``: awaited under the timeout if it is
    async (cancellable), else run in a worker process that is killed when it hangs."""
    assert cfg.ref is not None  # checked by the spec
    fn = import_ref(cfg.ref, "task.reward.ref")
    if inspect.iscoroutinefunction(fn):
        return await asyncio.wait_for(fn(answer, example), cfg.timeout_s)
    return await user.call(fn, (answer, example), cfg.timeout_s, f"reward {cfg.ref!r}")


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", "").strip())
    except ValueError:
        return None


@reward("exact")
def exact(answer: str, example: Example, cfg: RewardConfig) -> float:
    """1 if the answers match after case and whitespace folding."""
    return float(" ".join(answer.lower().split()) == " ".join(example.answer.lower().split()))


@reward("numeric")
def numeric(answer: str, example: Example, cfg: RewardConfig) -> float:
    """1 if both parse as numbers equal to 1e-6 relative tolerance."""
    a, b = _number(answer), _number(example.answer)
    return float(a is not None and b is not None and math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9))


@reward("reasoning_gym")
def reasoning_gym(answer: str, example: Example, cfg: RewardConfig) -> float:
    """The generator's own scorer (partial credit where the generator gives it)."""
    import reasoning_gym as rg

    return float(rg.get_score_answer_fn(example.meta["rg"])(answer, example.meta["entry"]))


@reward("python")
def python(answer: str, example: Example, cfg: RewardConfig) -> float:
    """The user's ``module:function(answer, example) -> float``."""
    if cfg.ref is None:
        raise SpecError("task.reward.ref: required for kind python")
    return float(import_ref(cfg.ref, "task.reward.ref")(answer, example))
