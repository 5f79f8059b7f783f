"""Run one agent graph on one input and record everything as a ``Trajectory``.

Nodes run in a deterministic topological order; a node's template sees ``{input}`` and the
output of each upstream node (``""`` when a probabilistic edge was dropped for this run). An
``llm`` node with ``samples > 1`` draws several completions: downstream templates see the first,
a ``vote`` node sees them all. A ``loop`` node is a ReAct loop: each turn the model writes
``Action: tool[argument]`` (the tool's output comes back as an ``Observation:`` user turn) or
``Answer: ...`` which ends the loop.

Failure contract: anything that goes wrong for this input (a tool that raises, garbage from the
model, a timeout) ends up in ``Trajectory.error`` and the trajectory scores 0. Only systemic
faults (``BackendError``: the model itself is unusable) propagate.

Randomness: every request's seed derives from (run seed, agent id, input id, node, sample,
turn), so a rerun or a ``--resume`` reproduces the same tokens.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import networkx as nx

from evoagent.errors import BackendError, SandboxError
from evoagent.execute.trajectory import LLMStep, ToolStep, Trajectory, anchor_key
from evoagent.graph.model import AgentGraph, LLMNode, LoopNode, ToolNode, VoteNode
from evoagent.llm.backend import Backend
from evoagent.llm.types import GenerationRequest, Message
from evoagent.tasks.datasets import Example
from evoagent.tasks.extract import get_extractor
from evoagent.tools import Tool, ToolContext, call_tool, make_tool

_ACTION = re.compile(r"Action:\s*([A-Za-z_][\w.:]*)\s*\[(.*?)\]", re.S)
_ANSWER = re.compile(r"Answer:\s*(.*)", re.S | re.I)
REACT_FORMAT = (
    "You can use tools. To call one, write exactly one line\n"
    "Action: tool_name[argument]\n"
    "and wait for the Observation. When you know the answer, write\n"
    "Answer: <the answer>\n"
    "Tools:\n"
)


@dataclass(frozen=True)
class ExecContext:
    """What an execution needs besides the graph and the input.

    Attributes:
        llm: the policy backend.
        tool_ctx: sandbox settings handed to tools.
        seed: run seed, mixed into every request seed.
        timeout_s: wall-clock budget of one whole execution.
        tool_timeout_s: budget of one tool call.
        temperature: when set, overrides every node's temperature (RL rollouts sample).
    """

    llm: Backend
    tool_ctx: ToolContext
    seed: int = 0
    timeout_s: float = 300.0
    tool_timeout_s: float = 15.0
    temperature: float | None = None
    tools: dict[str, Tool] = field(default_factory=dict)

    def tool(self, name: str) -> Tool:
        """The tool registered as ``name`` (or a ``module:function`` ref), built once."""
        if name not in self.tools:
            self.tools[name] = make_tool(name)
        return self.tools[name]


def request_seed(*parts: object) -> int:
    """A stable 63-bit seed from any parts (Python's ``hash`` is salted per process)."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


async def execute(
    graph: AgentGraph, example: Example, ctx: ExecContext, sample: int = 0
) -> Trajectory:
    """Run ``graph`` on ``example``; never raises for per-input failures (see module doc)."""
    traj = Trajectory(agent_id=graph.id, input_id=example.id, input=example.input)
    start = time.perf_counter()
    try:
        await asyncio.wait_for(_run(graph, example, ctx, sample, traj), ctx.timeout_s)
    except (BackendError, SandboxError):
        raise
    except TimeoutError:
        traj.error = f"execution timed out after {ctx.timeout_s}s"
    except Exception as e:  # the candidate boundary: a broken agent is data, not a crash
        traj.error = f"{type(e).__name__}: {e}"
    traj.seconds = time.perf_counter() - start
    return traj


async def _run(
    graph: AgentGraph, example: Example, ctx: ExecContext, sample: int, traj: Trajectory
) -> None:
    g = graph.digraph()
    rng = random.Random(request_seed(ctx.seed, graph.id, example.id, sample, "edges"))
    live = {(e.src, e.dst) for e in graph.edges if e.p is None or rng.random() < e.p}
    outputs: dict[str, list[str]] = {}
    for node_id in nx.lexicographical_topological_sort(g):
        node = graph.node(node_id)
        # A template may name any ancestor (graph.validate); a dropped direct edge blanks its source.
        upstream = {src: outputs[src][0] for src in nx.ancestors(g, node_id)}
        upstream |= {src: "" for src in g.predecessors(node_id) if (src, node_id) not in live}
        seed = (ctx.seed, graph.id, example.id, node_id, sample)
        if isinstance(node, VoteNode):
            texts = [t for src in g.predecessors(node_id) if (src, node_id) in live for t in outputs[src]]
            outputs[node_id] = [_vote(node, texts)]
        elif isinstance(node, ToolNode):
            arg = _fill(node.template, example.input, upstream)
            outputs[node_id] = [await _call_tool(ctx, node.id, node.tool, arg, traj)]
        elif isinstance(node, LLMNode):
            outputs[node_id] = await _llm(node, _fill(node.template, example.input, upstream), ctx, seed, traj)
        else:
            outputs[node_id] = [await _loop(node, _fill(node.template, example.input, upstream), ctx, seed, traj)]
    traj.output = outputs[graph.exit][0]


def _fill(template: str, text: str, upstream: Mapping[str, str]) -> str:
    return template.format_map({"input": text, **upstream})


def _temperature(node: LLMNode | LoopNode, ctx: ExecContext) -> float:
    return node.temperature if ctx.temperature is None else ctx.temperature


async def _llm(
    node: LLMNode, user: str, ctx: ExecContext, seed: tuple, traj: Trajectory
) -> list[str]:
    messages: list[Message] = [{"role": "system", "content": node.system}] if node.system else []
    for d in node.demos:
        messages += [{"role": "user", "content": d.input}, {"role": "assistant", "content": d.output}]
    messages.append({"role": "user", "content": user})
    temp = _temperature(node, ctx)
    n = node.samples if temp > 0 else 1  # greedy samples would all be equal
    reqs = [
        GenerationRequest(tuple(messages), node.max_tokens, temp, request_seed(*seed, k))
        for k in range(n)
    ]
    t0 = time.perf_counter()
    gens = await ctx.llm.generate(reqs)
    took = (time.perf_counter() - t0) / n
    for g in gens:
        traj.steps.append(_llm_step(node.id, tuple(messages), g, took))
    return [g.text for g in gens]


def _llm_step(node: str, messages: tuple[Message, ...], g, seconds: float) -> LLMStep:
    return LLMStep(
        node=node,
        messages=messages,
        text=g.text,
        prompt_ids=g.prompt_ids,
        completion_ids=g.completion_ids,
        logprobs=g.logprobs,
        weights_version=g.weights_version,
        anchor=anchor_key(node, messages[-1]["content"]),
        finish_reason=g.finish_reason,
        seconds=seconds,
    )


async def _call_tool(ctx: ExecContext, node: str, name: str, arg: str, traj: Trajectory) -> str:
    t0 = time.perf_counter()
    res = await call_tool(ctx.tool(name), arg, ctx.tool_ctx, ctx.tool_timeout_s)
    traj.steps.append(
        ToolStep(node, name, arg, res.output, res.ok, res.error, time.perf_counter() - t0)
    )
    return res.output if res.ok else f"error: {res.error}"


async def _loop(node: LoopNode, user: str, ctx: ExecContext, seed: tuple, traj: Trajectory) -> str:
    tools = {name: ctx.tool(name) for name in node.tools}
    listing = "\n".join(f"- {name}: {t.description}" for name, t in tools.items())
    system = (node.system + "\n\n" if node.system else "") + REACT_FORMAT + listing
    messages: list[Message] = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    text = ""
    for turn in range(node.max_turns):
        req = GenerationRequest(
            tuple(messages),
            node.max_tokens,
            _temperature(node, ctx),
            request_seed(*seed, turn),
            stop=("Observation:",),
        )
        t0 = time.perf_counter()
        (g,) = await ctx.llm.generate([req])
        traj.steps.append(_llm_step(node.id, tuple(messages), g, time.perf_counter() - t0))
        text = g.text
        action = _ACTION.search(text)
        answer = _ANSWER.search(text)
        if answer and (not action or answer.start() < action.start()):
            return answer.group(1).strip()
        if not action:
            return text  # the model answered without the format: take its words as the answer
        name, arg = action.group(1), action.group(2)
        if name in tools:
            obs = await _call_tool(ctx, node.id, name, arg, traj)
        else:
            obs = f"error: unknown tool {name!r}; use one of {sorted(tools)}"
        messages += [
            {"role": "assistant", "content": text[: action.end()]},
            {"role": "user", "content": f"Observation: {obs}"},
        ]
    return text


def _vote(node: VoteNode, texts: list[str]) -> str:
    """The most common extracted answer; ties go to the earliest; the full text is returned."""
    extract = get_extractor(node.extract)
    answers = [extract(t) for t in texts]
    counts: dict[str, int] = {}
    for a in answers:
        if a:
            counts[a] = counts.get(a, 0) + 1
    if not counts:
        return texts[0] if texts else ""
    best = max(counts, key=lambda a: (counts[a], -answers.index(a)))
    return texts[answers.index(best)]
