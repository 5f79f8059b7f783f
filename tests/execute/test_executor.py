"""The executor on a scripted backend: data flows along edges, tools and ReAct loops run, votes
count, and a broken agent becomes a trajectory with an error instead of an exception."""

from __future__ import annotations

import asyncio

import pytest

from evoagent.errors import BackendError
from evoagent.execute.evaluate import evaluate
from evoagent.execute.executor import ExecContext, execute
from evoagent.graph import graph_from_dict
from evoagent.llm.scripted import ScriptedBackend
from evoagent.spec.config import RewardConfig
from evoagent.tasks import Example
from evoagent.tools import ToolContext, register_tool

EX = Example("e1", "Calculate 12 + 7.", "19")


def ctx(handler, **kw) -> ExecContext:
    return ExecContext(ScriptedBackend(handler=handler), ToolContext(), seed=0, **kw)


def graph(nodes, edges=(), entry=None, exit_=None):
    return graph_from_dict(
        {"entry": entry or nodes[0]["id"], "exit": exit_ or nodes[-1]["id"], "nodes": list(nodes),
         "edges": list(edges)},
        "test",
    )


def last_user(r) -> str:
    return r.messages[-1]["content"]


def test_tool_output_flows_into_the_next_prompt():
    g = graph(
        [{"kind": "tool", "id": "calc", "tool": "calculator", "template": "{input}"},
         {"kind": "llm", "id": "answer", "template": "{input}\nresult: {calc}"}],
        [{"src": "calc", "dst": "answer"}],
    )
    seen = []
    t = asyncio.run(execute(g, EX, ctx(lambda r: seen.append(last_user(r)) or "19")))
    assert seen == ["Calculate 12 + 7.\nresult: 19"]
    assert t.error is None and t.output == "19"
    tool, llm = t.steps
    assert tool.kind == "tool" and tool.output == "19" and tool.ok
    assert llm.kind == "llm" and llm.completion_ids == tuple(b"19") and len(llm.logprobs) == 2
    assert llm.anchor.startswith("answer:")


def test_demos_become_user_assistant_turns():
    g = graph([{"kind": "llm", "id": "a", "system": "be brief",
                "demos": [{"input": "1+1", "output": "2"}]}])
    captured = []
    asyncio.run(execute(g, EX, ctx(lambda r: captured.append(r.messages) or "x")))
    roles = [m["role"] for m in captured[0]]
    assert roles == ["system", "user", "assistant", "user"]


def test_react_loop_calls_tools_until_answer():
    g = graph([{"kind": "loop", "id": "solve", "tools": ["calculator"], "max_turns": 3}])

    def handler(r):
        if r.messages[-1]["content"].startswith("Observation: 19"):
            return "Answer: 19"
        return "I should compute. Action: calculator[12 + 7]"

    t = asyncio.run(execute(g, EX, ctx(handler)))
    assert t.output == "19" and t.error is None
    assert [s.kind for s in t.steps] == ["llm", "tool", "llm"]
    assert "calculator" in t.steps[0].messages[0]["content"]  # tools are described to the model


def test_react_unknown_tool_is_an_observation_not_a_crash():
    g = graph([{"kind": "loop", "id": "solve", "tools": ["calculator"], "max_turns": 2}])
    t = asyncio.run(execute(g, EX, ctx(lambda r: "Action: hammer[nail]")))
    assert t.error is None
    assert "unknown tool 'hammer'" in t.steps[1].messages[-1]["content"]


def test_vote_takes_the_majority_answer():
    g = graph(
        [{"kind": "llm", "id": "think", "temperature": 0.8, "samples": 5},
         {"kind": "vote", "id": "vote"}],
        [{"src": "think", "dst": "vote"}],
    )
    replies = iter(["maybe 18", "it is 19", "20", "19!", "so 19"])  # the first sample is outvoted
    t = asyncio.run(execute(g, EX, ctx(lambda r: next(replies))))
    assert t.output == "it is 19" and len(t.llm_steps) == 5  # the first text with the majority answer
    assert len({s.messages == t.llm_steps[0].messages for s in t.llm_steps}) == 1


def test_dropped_edge_leaves_an_empty_placeholder():
    g = graph(
        [{"kind": "llm", "id": "a"}, {"kind": "llm", "id": "b", "template": "[{a}]"}],
        [{"src": "a", "dst": "b", "p": 0.0}],
    )
    seen = []
    asyncio.run(execute(g, EX, ctx(lambda r: seen.append(last_user(r)) or "A")))
    assert seen[-1] == "[]"


def test_failing_tool_and_hanging_tool_are_recorded():
    async def hang(arg: str) -> str:
        await asyncio.sleep(30)
        return "never"

    register_tool_once("test_hang", hang)
    g = graph(
        [{"kind": "tool", "id": "t", "tool": "test_hang", "template": "{input}"},
         {"kind": "llm", "id": "a", "template": "{t}"}],
        [{"src": "t", "dst": "a"}],
    )
    t = asyncio.run(execute(g, EX, ctx(lambda r: last_user(r), tool_timeout_s=0.2)))
    assert t.error is None and not t.steps[0].ok and "timed out" in t.steps[0].error
    assert t.output.startswith("error:")


def register_tool_once(name, fn):
    from evoagent.tools import FunctionTool, known_tools

    if name not in known_tools():
        register_tool(FunctionTool(name, fn))


def test_execution_timeout_counts_the_agents_own_work_not_the_model():
    async def slow_tool(arg: str) -> str:
        await asyncio.sleep(0.6)
        return arg

    def slow_model(r):
        import time

        time.sleep(0.3)  # a busy model: queueing behind other executions' batches
        return "x"

    register_tool_once("test_slow", slow_tool)
    tool_graph = graph([{"kind": "tool", "id": "t", "tool": "test_slow", "template": "{input}"}])
    t = asyncio.run(execute(tool_graph, EX, ctx(lambda r: "x", timeout_s=0.2, tool_timeout_s=5)))
    assert "timed out after 0.2s" in t.error
    chain = graph([{"kind": "llm", "id": "a"}, {"kind": "llm", "id": "b", "template": "{a}"}],
                  [{"src": "a", "dst": "b"}])
    t = asyncio.run(execute(chain, EX, ctx(slow_model, timeout_s=0.2)))
    assert t.error is None and t.output == "x" and t.seconds >= 0.6


def test_concurrency_is_bounded_across_evaluate_calls():
    import threading

    live, peak, lock = [0], [0], threading.Lock()

    def model(r):
        import time

        with lock:
            live[0] += 1
            peak[0] = max(peak[0], live[0])
        time.sleep(0.05)
        with lock:
            live[0] -= 1
        return "1"

    c = ctx(model, concurrency=3)
    g = graph([{"kind": "llm", "id": "a"}])
    exs = [Example(str(i), f"{i} + 1", str(i + 1)) for i in range(5)]

    async def two_at_once():
        return await asyncio.gather(*(evaluate(g, exs, c, RewardConfig()) for _ in range(3)))

    evs = asyncio.run(two_at_once())
    assert [e.n for e in evs] == [5, 5, 5] and peak[0] == 3


def test_handler_garbage_is_data():
    t = asyncio.run(execute(graph([{"kind": "llm", "id": "a"}]), EX,
                            ctx(lambda r: "\x00\ufffd garbage {input} }{")))
    assert t.error is None and "garbage" in t.output


def test_backend_failure_is_systemic():
    def dead(r):
        raise BackendError("model gone")

    with pytest.raises(BackendError):
        asyncio.run(execute(graph([{"kind": "llm", "id": "a"}]), EX, ctx(dead)))


def test_evaluate_scores_and_keeps_trajectories():
    g = graph([{"kind": "llm", "id": "a"}])
    exs = [Example(str(i), f"{i} + 1", str(i + 1)) for i in range(6)]
    ev = asyncio.run(evaluate(g, exs, ctx(lambda r: "2" if "1 + 1" in last_user(r) else "0"), RewardConfig()))
    assert ev.n == 6 and ev.score == pytest.approx(1 / 6)
    assert len(ev.successes) == 1 and len(ev.failures) == 5


def test_a_template_may_name_any_ancestor():
    g = graph(
        [{"kind": "llm", "id": "a"}, {"kind": "llm", "id": "b", "template": "{a}!"},
         {"kind": "llm", "id": "c", "template": "{a} then {b}"}],
        [{"src": "a", "dst": "b"}, {"src": "b", "dst": "c"}],
    )
    seen, replies = [], iter("ABC")
    t = asyncio.run(execute(g, EX, ctx(lambda r: seen.append(last_user(r)) or next(replies))))
    assert t.error is None and seen[1:] == ["A!", "A then B"]


def test_a_child_that_changes_one_node_makes_only_that_nodes_calls(tiny_backend):
    """Request seeds do not depend on the agent id, so the parent's unchanged node asks the
    very requests the parent asked, and the backend's cache answers them within a version."""
    nodes = [{"kind": "llm", "id": "plan", "system": "Plan the steps.", "max_tokens": 6},
             {"kind": "llm", "id": "answer", "system": "Answer.", "template": "{input}\n{plan}",
              "max_tokens": 6}]
    parent = graph(nodes, [{"src": "plan", "dst": "answer"}])
    child = graph([nodes[0], {**nodes[1], "system": "Answer with a number."}],
                  [{"src": "plan", "dst": "answer"}])
    assert child.id != parent.id
    backend = tiny_backend()
    c = ExecContext(backend, ToolContext(), seed=0)
    inputs = [Example(f"e{i}", f"Calculate {i} + 7.", str(i + 7)) for i in range(4)]
    first = asyncio.run(evaluate(parent, inputs, c, RewardConfig()))
    assert (backend.cache.misses, backend.cache.hits) == (8, 0)
    second = asyncio.run(evaluate(child, inputs, c, RewardConfig()))
    assert (backend.cache.misses, backend.cache.hits) == (12, 4)  # only "answer" ran again
    for a, b in zip(first.trajectories, second.trajectories, strict=True):
        assert a.steps[0].completion_ids == b.steps[0].completion_ids
