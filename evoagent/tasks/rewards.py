"""Rewards: score an extracted answer against an example, in [0, 1] (higher is better).

A registry of ``fn(answer, example, cfg, sandbox) -> float | (float, str)`` (``sandbox``: the
run's limits for code, which ``unit_tests`` runs the agent's code under): the string is textual
feedback (what was wrong, as GEPA's evaluators give it), which the trajectory keeps and the
mutator reads beside the trace. ``score`` is the one entry point the
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
from typing import NamedTuple

from evoagent.errors import SandboxError, SpecError, UserCodeError
from evoagent.registry import Registry
from evoagent.spec.config import RewardConfig
from evoagent.tasks.datasets import Example, import_ref
from evoagent.tasks.extract import get_extractor
from evoagent.tools.sandbox import SandboxConfig
from evoagent.usercode import UserCode

RewardFn = Callable[..., object]  # (answer, example, cfg, sandbox) -> float | (float, str), or awaitable
_REGISTRY: Registry[RewardFn] = Registry("reward", SpecError, field="task.reward.kind")
reward = _REGISTRY.register  # ``@reward("name")``: register a ``RewardFn``
known_rewards = _REGISTRY.names
get_reward = _REGISTRY.get


class Scored(NamedTuple):
    """A reward's verdict on one output."""

    value: float  # in [0, 1]; 0.0 when the reward failed
    error: str | None = None  # why the reward failed (the sample then says nothing to RL)
    feedback: str | None = None  # the reward's own words on the answer, for the mutator


async def score(
    output: str, example: Example, cfg: RewardConfig, user: UserCode | None = None,
    sandbox: SandboxConfig | None = None,
) -> Scored:
    """The reward of ``output``; 0.0 and the reason if the reward failed."""
    fn = get_reward(cfg.kind)
    extract = get_extractor(cfg.extract)
    try:
        answer = extract(output)
        limits = sandbox or SandboxConfig()
        if cfg.kind == "python" and user is not None:
            value = await _user_reward(answer, example, cfg, user)
        elif inspect.iscoroutinefunction(fn):  # e.g. unit_tests: no thread held while it waits
            value = await asyncio.wait_for(fn(answer, example, cfg, limits), cfg.timeout_s)
        else:
            value = await asyncio.wait_for(
                asyncio.to_thread(fn, answer, example, cfg, limits), cfg.timeout_s
            )
    except TimeoutError:
        return Scored(0.0, f"reward timed out after {cfg.timeout_s}s")
    except UserCodeError as e:
        return Scored(0.0, str(e))
    except SandboxError:  # the sandbox itself cannot start: the run's problem, not the sample's
        raise
    except Exception as e:  # the user's reward is a candidate boundary: its failure is data
        return Scored(0.0, f"reward raised {type(e).__name__}: {e}")
    feedback = None
    if isinstance(value, tuple | list) and len(value) == 2 and isinstance(value[1], str | None):
        value, feedback = value
    try:
        value = float(value)
    except (TypeError, ValueError):
        return Scored(0.0, f"reward returned {value!r}, not a number or (number, feedback)")
    if not math.isfinite(value):
        return Scored(0.0, f"reward returned {value}")
    return Scored(min(1.0, max(0.0, value)), None, feedback)


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
def exact(answer: str, example: Example, cfg: RewardConfig, sandbox: SandboxConfig) -> float:
    """1 if the answers match after case and whitespace folding."""
    return float(" ".join(answer.lower().split()) == " ".join(example.answer.lower().split()))


@reward("numeric")
def numeric(answer: str, example: Example, cfg: RewardConfig, sandbox: SandboxConfig) -> float:
    """1 if both parse as numbers equal to 1e-6 relative tolerance."""
    a, b = _number(answer), _number(example.answer)
    return float(a is not None and b is not None and math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9))


@reward("reasoning_gym")
def reasoning_gym(answer: str, example: Example, cfg: RewardConfig, sandbox: SandboxConfig) -> float:
    """The generator's own scorer (partial credit where the generator gives it)."""
    import reasoning_gym as rg

    return float(rg.get_score_answer_fn(example.meta["rg"])(answer, example.meta["entry"]))


@reward("python")
def python(
    answer: str, example: Example, cfg: RewardConfig, sandbox: SandboxConfig
) -> float | tuple[float, str]:
    """The user's ``module:function(answer, example) -> float | (float, feedback)``."""
    if cfg.ref is None:
        raise SpecError("task.reward.ref: required for kind python")
    return import_ref(cfg.ref, "task.reward.ref")(answer, example)
