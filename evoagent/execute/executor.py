"""Run one agent graph on one input and record everything as a ``Trajectory``.

Nodes run in a deterministic topological order; a node's template sees ``{input}`` and the
output of each upstream node (``""`` when a probabilistic edge was dropped for this run). An
``llm`` node with ``samples > 1`` draws several completions: downstream templates see the first,
a ``vote`` node sees them all. A ``loop`` node is a ReAct loop: each turn the model writes
``Action: tool[argument]`` (the tool's output comes back as an ``Observation:`` user turn) or
``Answer: ...`` which ends the loop; or, with ``env``, it plays the input's environment episode
(each reply is a move, each observation a user turn). Loop turns are token-in/token-out: a turn's
prompt is the previous prompt and completion ids plus the new turn's tokens.

Failure contract: anything that goes wrong for this input (a tool that raises, garbage from the
model, a timeout) ends up in ``Trajectory.error`` and the trajectory scores 0. Only systemic
faults (``BackendError``: the model itself is unusable) propagate.

Randomness: every request's seed derives from (run seed, input id, node id, sample, turn), not
from the agent id, so a rerun or a ``--resume`` reproduces the same tokens, and a child whose
node sees the same messages as its parent's asks the very request its parent asked: the
backend's cache answers it without a model call.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import re
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from evoagent.errors import BackendError, SandboxError
from evoagent.execute.trajectory import LLMStep, ToolStep, Trajectory, anchor_key
from evoagent.graph.model import AgentGraph, LLMNode, LoopNode, ToolNode, VoteNode
from evoagent.llm.backend import Backend
from evoagent.llm.types import Generation, GenerationRequest, Message
from evoagent.tasks.datasets import Example
from evoagent.tasks.envs import Episode, make_episode
from evoagent.tasks.extract import get_extractor
from evoagent.tools import Tool, ToolContext, call_tool, make_tool
from evoagent.tools.python_tool import program
from evoagent.usercode import UserCode

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
        timeout_s: budget of one execution's own work: wall-clock time minus the time spent
            waiting for the model, which is bounded by ``max_tokens`` and shared with every
            other execution in the batcher's queue (a busy model must not time agents out).
        tool_timeout_s: budget of one tool call.
        temperature: when set, overrides every node's temperature (RL rollouts sample).
        concurrency: executions in flight at once across every caller sharing this context.
        gate: the semaphore enforcing ``concurrency``; ``dataclasses.replace`` hands it on.
        user: the worker processes that run the user's synchronous rewards and tools (killed
            when they hang); shared the same way.
        node_adapters: each llm node's requests ask for the adapter named by its id
            (``rl.adapters: per_node``).
    """

    llm: Backend
    tool_ctx: ToolContext
    seed: int = 0
    timeout_s: float = 300.0
    tool_timeout_s: float = 15.0
    temperature: float | None = None
    tools: dict[str, Tool] = field(default_factory=dict)
    concurrency: int = 64
    gate: asyncio.Semaphore | None = None
    user: UserCode = field(default_factory=UserCode)
    node_adapters: bool = False

    def __post_init__(self) -> None:
        if self.gate is None:
            object.__setattr__(self, "gate", asyncio.Semaphore(self.concurrency))

    def tool(self, name: str) -> Tool:
        """The tool registered as ``name`` (or a ``module:function`` ref), built once."""
        if name not in self.tools:
            self.tools[name] = make_tool(name, self.user)
        return self.tools[name]


class _Clock:
    """An execution's own time: wall clock with the model's serving time taken out."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.waited = 0.0
        self.waiting_since: float | None = None

    def own(self) -> float:
        now = time.perf_counter()
        current = now - self.waiting_since if self.waiting_since is not None else 0.0
        return now - self.start - self.waited - current

    async def generate(self, llm: Backend, reqs: list[GenerationRequest]) -> list[Generation]:
        """``llm.generate`` with its time (queueing included) kept off the execution budget."""
        self.waiting_since = time.perf_counter()
        try:
            return await llm.generate(reqs)
        finally:
            self.waited += time.perf_counter() - self.waiting_since
            self.waiting_since = None


def request_seed(*parts: object) -> int:
    """A stable 63-bit seed from any parts (Python's ``hash`` is salted per process)."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


async def execute(
    graph: AgentGraph, example: Example, ctx: ExecContext, sample: int = 0
) -> Trajectory:
    """Run ``graph`` on ``example``; never raises for per-input failures (see module doc).

    At most ``ctx.concurrency`` executions run at once (one gate for every caller of ``ctx``).
    """
    assert ctx.gate is not None
    async with ctx.gate:
        traj = Trajectory(agent_id=graph.id, input_id=example.id, input=example.input)
        clock = _Clock()
        try:
            await _within_budget(_run(graph, example, ctx, sample, traj, clock), clock, ctx.timeout_s)
        except (BackendError, SandboxError):
            raise
        except TimeoutError:
            traj.error = f"execution timed out after {ctx.timeout_s}s of its own work"
        except ContextOverflow as e:
            traj.error, traj.skip = str(e), "context"
        except Exception as e:  # the candidate boundary: a broken agent is data, not a crash
            traj.error = f"{type(e).__name__}: {e}"
        traj.seconds = time.perf_counter() - clock.start
        return traj


async def _within_budget(work: Coroutine[Any, Any, None], clock: _Clock, limit: float) -> None:
    """Await ``work``; cancel it and raise TimeoutError once its own time passes ``limit``."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            left = limit - clock.own()
            if left <= 0:
                task.cancel()
                raise TimeoutError
            done, _ = await asyncio.wait({task}, timeout=left)
            if done:
                return task.result()
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def _run(
    graph: AgentGraph, example: Example, ctx: ExecContext, sample: int, traj: Trajectory,
    clock: _Clock,
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
        seed = (ctx.seed, example.id, node_id, sample)
        if isinstance(node, VoteNode):
            texts = [t for src in g.predecessors(node_id) if (src, node_id) in live for t in outputs[src]]
            outputs[node_id] = [_vote(node, texts)]
        elif isinstance(node, ToolNode):
            arg = _fill(node.template, example.input, upstream)
            run = program(node.source, arg) if node.source is not None else arg
            outputs[node_id] = [await _call_tool(ctx, node.id, node.tool, arg, traj, run)]
        elif isinstance(node, LLMNode):
            user = _fill(node.template, example.input, upstream)
            outputs[node_id] = await _llm(node, user, ctx, seed, traj, clock)
        else:
            user = _fill(node.template, example.input, upstream)
            outputs[node_id] = [await _loop(node, user, ctx, seed, traj, clock, example)]
    traj.output = outputs[graph.exit][0]


def _fill(template: str, text: str, upstream: Mapping[str, str]) -> str:
    return template.format_map({"input": text, **upstream})


def _temperature(node: LLMNode | LoopNode, ctx: ExecContext) -> float:
    return node.temperature if ctx.temperature is None else ctx.temperature


def llm_messages(node: LLMNode, user: str) -> list[Message]:
    """The chat an ``llm`` node sends: its system text, its demos as earlier turns, then
    ``user`` (its filled template)."""
    messages: list[Message] = [{"role": "system", "content": node.system}] if node.system else []
    for d in node.demos:
        messages += [{"role": "user", "content": d.input}, {"role": "assistant", "content": d.output}]
    return messages + [{"role": "user", "content": user}]


async def _llm(
    node: LLMNode, user: str, ctx: ExecContext, seed: tuple, traj: Trajectory, clock: _Clock
) -> list[str]:
    messages = llm_messages(node, user)
    temp = _temperature(node, ctx)
    n = node.samples if temp > 0 else 1  # greedy samples would all be equal
    reqs = [
        GenerationRequest(tuple(messages), node.max_tokens, temp, request_seed(*seed, k),
                          adapter=node.id if ctx.node_adapters else None)
        for k in range(n)
    ]
    t0 = time.perf_counter()
    gens = await clock.generate(ctx.llm, reqs)
    took = (time.perf_counter() - t0) / n
    for g in gens:
        traj.steps.append(_llm_step(node.id, tuple(messages), g, took))
    return [g.text for g in gens]


def _llm_step(node: str, messages: tuple[Message, ...], g: Generation, seconds: float) -> LLMStep:
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


async def _call_tool(
    ctx: ExecContext, node: str, name: str, arg: str, traj: Trajectory, run: str | None = None
) -> str:
    """Call tool ``name`` with ``run`` (default ``arg``); the trajectory records ``arg``, what
    the node was given (a tool with its own source runs a program built from it)."""
    t0 = time.perf_counter()
    res = await call_tool(ctx.tool(name), arg if run is None else run, ctx.tool_ctx, ctx.tool_timeout_s)
    traj.steps.append(
        ToolStep(node, name, arg, res.output, res.ok, res.error, time.perf_counter() - t0)
    )
    return res.output if res.ok else f"error: {res.error}"


class ContextOverflow(Exception):
    """A loop's next prompt no longer fits the backend's context window (it was truncated)."""


async def _loop(
    node: LoopNode, user: str, ctx: ExecContext, seed: tuple, traj: Trajectory, clock: _Clock,
    example: Example,
) -> str:
    """Run a ReAct loop (``tools``) or play an environment episode (``env``), token-in/token-out:
    each turn's request carries the previous prompt and completion ids as ``prefix_ids``, so the
    model sees its own sampled tokens, not a re-rendering of their text."""
    turn_fn, system, stop, episode = await _turns(node, ctx, traj, example)
    messages: list[Message] = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": user})
    prev: Generation | None = None
    text = ""
    for turn in range(node.max_turns):
        # token-in where the backend reports token ids (a chat API server does not)
        prefix = prev.prompt_ids + prev.completion_ids if prev is not None and prev.prompt_ids else None
        req = GenerationRequest(
            tuple(messages), node.max_tokens, _temperature(node, ctx),
            request_seed(*seed, turn), stop=stop, prefix_ids=prefix,
            continued=turn + 1 < node.max_turns, adapter=node.id if ctx.node_adapters else None,
        )
        t0 = time.perf_counter()
        (g,) = await clock.generate(ctx.llm, [req])
        if prefix is not None and g.prompt_ids[: len(prefix)] != prefix:
            raise ContextOverflow(
                f"node {node.id!r}: the episode outgrew the policy's context window at turn "
                f"{turn} ({len(prefix)} tokens before the new turn; raise policy.max_context "
                "or lower max_turns)"
            )
        traj.steps.append(_llm_step(node.id, tuple(messages), g, time.perf_counter() - t0))
        text = g.text
        observation, final = await turn_fn(text)
        if final is not None:
            text = final
            break
        messages += [
            {"role": "assistant", "content": text},
            {"role": "user", "content": observation},
        ]
        prev = g
    if episode is not None:  # the game's score, final or partial when the turns ran out
        traj.env_reward = await asyncio.to_thread(episode.score)
    return text


TurnFn = Callable[[str], Awaitable[tuple[str, str | None]]]  # reply -> (observation, final)


async def _turns(
    node: LoopNode, ctx: ExecContext, traj: Trajectory, example: Example
) -> tuple[TurnFn, str, tuple[str, ...], Episode | None]:
    """What answers the model's replies, the system prompt, the stop strings, and the episode
    being played (None for a ReAct loop)."""
    if node.env is not None:
        try:
            episode = await asyncio.wait_for(
                asyncio.to_thread(make_episode, node.env, example), ctx.tool_timeout_s
            )
        except TimeoutError:
            raise RuntimeError(
                f"env {node.env!r} did not start an episode within {ctx.tool_timeout_s}s"
            ) from None

        async def play(reply: str) -> tuple[str, str | None]:
            t0 = time.perf_counter()
            try:
                obs, done = await asyncio.wait_for(
                    asyncio.to_thread(episode.step, reply), ctx.tool_timeout_s
                )
            except TimeoutError:
                raise RuntimeError(
                    f"env {node.env!r} did not answer within {ctx.tool_timeout_s}s"
                ) from None
            traj.steps.append(
                ToolStep(node.id, f"env:{node.env}", reply, obs, True, None, time.perf_counter() - t0)
            )
            return obs, (obs if done else None)

        return play, node.system, (), episode

    tools = {name: ctx.tool(name) for name in node.tools}
    listing = "\n".join(f"- {name}: {t.description}" for name, t in tools.items())
    system = (node.system + "\n\n" if node.system else "") + REACT_FORMAT + listing

    async def react(reply: str) -> tuple[str, str | None]:
        action = _ACTION.search(reply)
        answer = _ANSWER.search(reply)
        if answer and (not action or answer.start() < action.start()):
            return "", answer.group(1).strip()
        if not action:
            return "", reply  # the model answered without the format: take its words
        name, arg = action.group(1), action.group(2)
        if name in tools:
            obs = await _call_tool(ctx, node.id, name, arg, traj)
        else:
            obs = f"error: unknown tool {name!r}; use one of {sorted(tools)}"
        return f"Observation: {obs}", None

    return react, system, ("Observation:",), None


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
