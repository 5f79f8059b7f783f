"""The user's synchronous code runs in worker processes: one that hangs is killed when its time
is up (no thread is left behind), one that raises is data, and the pool keeps serving."""

from __future__ import annotations

import asyncio
import os
import random
import sys
import textwrap

import pytest

from evoagent.errors import MutationError, UserCodeError
from evoagent.evolve.operators import MutationContext, Operator
from evoagent.graph.model import AgentGraph, LLMNode
from evoagent.llm.scripted import ScriptedBackend
from evoagent.spec.config import RewardConfig
from evoagent.tasks.datasets import Example
from evoagent.tasks.rewards import score
from evoagent.tools import ToolContext, call_tool, make_tool
from evoagent.usercode import UserCode

PLUGIN = '''
import os, random, time

def slow_reward(answer, example):
    if answer == "hang":
        time.sleep(600)
    return float(answer == example.answer)

def bad_reward(answer, example):
    raise KeyError("no such field")

def pid(argument):
    """the worker's pid"""
    return str(os.getpid())

def hang(argument):
    """never answers"""
    time.sleep(600)

def rename(parents, ctx):
    g = parents[0]
    seen = len(ctx.history())
    node = g.node(g.exit).model_copy(update={"system": f"v{ctx.rng.randint(0, 10**6)} of {seen} in {os.getpid()}"})
    return g.replace_node(node)

def sleepy(parents, ctx):
    time.sleep(600)

def refuse(parents, ctx):
    from evoagent.errors import MutationError
    raise MutationError("nothing to rename")

def wants_llm(parents, ctx):
    import asyncio
    return asyncio.run(ctx.llm.generate([]))
'''

EX = Example("e1", "What is 2 + 3?", "5")


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    (tmp_path / "plugin_mod.py").write_text(textwrap.dedent(PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    return importlib.import_module("plugin_mod")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead too
        return f.read().split()[2] != "Z"


def test_a_hanging_reward_is_killed_and_the_pool_serves_on(plugin):
    user = UserCode(workers=1)
    cfg = RewardConfig(kind="python", ref="plugin_mod:slow_reward", extract="raw", timeout_s=1)

    async def go():
        hung = await score("hang", EX, cfg, user)
        fine = await score("5", EX, cfg, user)
        return hung, fine

    hung, fine = asyncio.run(go())
    assert hung[0] == 0.0 and "timed out after 1s" in hung[1] and "killed" in hung[1]
    assert fine == (1.0, None, None)
    assert user.killed == 1
    asyncio.run(user.aclose())


def test_a_raising_reward_is_a_reason_not_a_crash(plugin):
    cfg = RewardConfig(kind="python", ref="plugin_mod:bad_reward", extract="raw")
    value, reason, _ = asyncio.run(score("5", EX, cfg, UserCode()))
    assert value == 0.0 and "KeyError" in reason and "no such field" in reason


def test_a_hanging_tool_is_killed_when_call_tool_times_out(plugin):
    user = UserCode(workers=1)
    pid_tool, hang_tool = make_tool("plugin_mod:pid", user), make_tool("plugin_mod:hang", user)

    async def go():
        first = await call_tool(pid_tool, "", ToolContext(), 5)
        hung = await call_tool(hang_tool, "", ToolContext(), 1)
        second = await call_tool(pid_tool, "", ToolContext(), 5)
        return first, hung, second

    first, hung, second = asyncio.run(go())
    assert first.ok and int(first.output) != os.getpid()
    assert not hung.ok and "timed out" in hung.error
    assert not alive(int(first.output))  # the worker that hung was the same process: killed
    assert second.ok and second.output != first.output
    asyncio.run(user.aclose())
    assert not alive(int(second.output))


def graph() -> AgentGraph:
    return AgentGraph(entry="a", exit="a", nodes=(LLMNode(id="a", system="Answer."),))


def context(seed: int = 7) -> MutationContext:
    return MutationContext(llm=ScriptedBackend(), rng=random.Random(seed), task="t",
                           history=lambda: [(graph(), 0.5), (graph(), 0.25)])


def test_a_sync_operator_runs_in_a_worker_with_history_and_the_slots_rng(plugin):
    ctx, alone = context(), context()
    child = asyncio.run(Operator("rename", plugin.rename).apply([graph()], ctx, UserCode(), 10))
    expected = plugin.rename([graph()], alone)  # what the operator does in this process
    made, here = child.node("a").system.split(" in "), expected.node("a").system.split(" in ")
    assert made[0] == here[0] and made[0].endswith("of 2")  # the same draw, the same history
    assert made[1] != here[1] == str(os.getpid())  # but made in another process
    assert ctx.rng.random() == alone.rng.random()  # the worker's draws came back


def test_a_hanging_operator_is_killed_and_one_that_does_not_apply_says_so(plugin):
    user = UserCode()
    with pytest.raises(UserCodeError, match=r"operator 'sleepy' timed out after 1s"):
        asyncio.run(Operator("sleepy", plugin.sleepy).apply([graph()], context(), user, 1))
    with pytest.raises(MutationError, match="nothing to rename"):
        asyncio.run(Operator("refuse", plugin.refuse).apply([graph()], context(), user, 10))
    with pytest.raises(UserCodeError, match="make it async to use ctx.llm"):
        asyncio.run(Operator("wants_llm", plugin.wants_llm).apply([graph()], context(), user, 10))
    assert user.killed == 1


def test_a_closure_cannot_cross_and_says_why():
    def local(parents, ctx):
        return parents[0]

    with pytest.raises(UserCodeError, match="cannot run in a worker process"):
        asyncio.run(Operator("local", local).apply([graph()], context(), UserCode(), 10))


def test_nothing_is_left_running_after_a_run(plugin):
    """The worker processes end with the pool (and with this process, as daemons)."""
    user = UserCode(workers=2)
    tool = make_tool("plugin_mod:pid", user)

    async def go():
        return await asyncio.gather(*(call_tool(tool, "", ToolContext(), 5) for _ in range(4)))

    pids = {int(r.output) for r in asyncio.run(go())}
    assert 1 <= len(pids) <= 2
    asyncio.run(user.aclose())
    assert not any(alive(p) for p in pids)
    assert sys.modules["plugin_mod"] is plugin


def test_one_pool_serves_calls_from_one_event_loop_after_another(plugin):
    """A script may score with the same pool under several ``asyncio.run``s (bench scripts do):
    the pool's slots belong to no one loop."""
    user = UserCode(workers=1)
    cfg = RewardConfig(kind="python", ref="plugin_mod:slow_reward", extract="raw")

    async def two_at_once():  # more calls than workers: the second waits on the slots
        return await asyncio.gather(score("5", EX, cfg, user), score("5", EX, cfg, user))

    for _ in range(2):
        assert asyncio.run(two_at_once()) == [(1.0, None, None)] * 2
    asyncio.run(user.aclose())
