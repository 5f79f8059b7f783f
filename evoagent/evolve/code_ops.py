"""Operators that rewrite the agent's own code: the Darwin Gödel Machine's self-modification,
scoped to the tools an agent owns.

A tool node with ``tool: python`` and a ``source`` holds its program in the graph (so the
content id covers it): ``main(text: str) -> str`` runs in the sandbox on the node's rendered
template. ``rewrite_tool`` shows the mutator that program with the failing executions that
called it (what the tool received and returned, the agent's answer, the expected one) and asks
for a corrected program; or, with probability ``insert``, for a new tool of that kind before an
llm node. The new program must compile, define ``main`` and run without crashing in the sandbox
on an input the tool was given (a failing one first), under the task's limits; otherwise the
child is archived as invalid with the error. ``evoagent archive diff`` and the report show the
change as a unified diff.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from evoagent.errors import GraphError, MutationError
from evoagent.evolve.operators import Feedback, MutationContext, mutation
from evoagent.evolve.structure_ops import fresh_id, insert_before
from evoagent.graph.model import AgentGraph, LLMNode, ToolNode
from evoagent.graph.validate import check_source
from evoagent.llm.types import GenerationRequest
from evoagent.tools.python_tool import program, strip_fences
from evoagent.tools.sandbox import run_python

REWRITE = """You maintain a Python tool that an AI agent uses to solve this task:
{task}

The tool `{node}` is given a text and returns a text. Its program:
```python
{source}
```

On these inputs the agent answered wrong:
{cases}

Find what the program gets wrong and write the corrected program. Keep what already works.
Reply with one ```python block that defines main(text: str) -> str."""

INSERT = """An AI agent solves this task:
{task}

Its step `{node}` is shown this prompt:
{template}

On these inputs the agent answered wrong:
{cases}

Write a Python tool that computes, from the input text, a result that would let the step
answer correctly; the step will be shown what it returns. Reply with one ```python block that
defines main(text: str) -> str."""


class RewriteToolSettings(BaseModel):
    """``rewrite_tool``'s settings (task.yaml ``params``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    insert: float = Field(0.25, ge=0, le=1, description="chance of writing a new tool before an "
                          "llm node instead of rewriting one the agent has")
    cases: int = Field(4, ge=1, le=16, description="failing executions shown to the mutator")


def _cases(failures: Sequence[Feedback], node: str | None, n: int) -> str:
    """The failures as the mutator reads them: the tool's input and output where it ran."""
    out = []
    for k, f in enumerate(failures[:n], 1):
        lines = [f"{k}. input: {f.input[:400]}"]
        for s in f.steps:
            if s.kind == "tool" and s.node == node:
                lines.append(f"   the tool got: {_argument(s.shown)[:300]}\n   the tool returned: {s.produced[:300]}")
        lines.append(f"   the agent answered: {f.output[:200]}\n   expected: {f.expected[:200]}")
        out.append("\n".join(lines))
    return "\n".join(out) or "(no failing execution was recorded)"


def _argument(shown: str) -> str:
    """The argument of a ``tool(argument)`` trace line."""
    return shown.partition("(")[2][:-1] if shown.endswith(")") else shown


@mutation("rewrite_tool", settings=RewriteToolSettings)
async def rewrite_tool(parents: Sequence[AgentGraph], ctx: MutationContext) -> AgentGraph:
    """Rewrite the program of a python tool the agent owns, or write a new one before an llm
    node, from the failing executions; the new program is tried in the sandbox first."""
    graph = parents[0]
    cfg: RewriteToolSettings = ctx.settings or RewriteToolSettings()
    owned = [n for n in graph.nodes if isinstance(n, ToolNode) and n.source is not None]
    if not owned:
        raise MutationError("rewrite_tool: the parent has no python tool of its own (a tool node with "
                            "tool: python and a source), so it does not apply")
    fed = {e.dst for e in graph.edges if e.src in {n.id for n in owned}}
    open_nodes = [n for n in graph.nodes if isinstance(n, LLMNode) and n.id not in fed]
    if open_nodes and ctx.rng.random() < cfg.insert:
        target = ctx.rng.choice(open_nodes)
        prompt = INSERT.format(task=ctx.task, node=target.id, template=target.template,
                               cases=_cases(ctx.failures, None, cfg.cases))
        source = await _ask(ctx, prompt)
        tool = ToolNode(id=fresh_id(graph, "tool"), tool="python", template="{input}", source=source)
        child = insert_before(graph, target, tool, "tool")
        node, arguments = tool, [f.input for f in ctx.failures]
    else:
        called = {n.id: sum(s.node == n.id for f in ctx.failures for s in f.steps) for n in owned}
        most = max(called.values())
        node = ctx.rng.choice([n for n in owned if called[n.id] == most])
        prompt = REWRITE.format(task=ctx.task, node=node.id, source=node.source,
                                cases=_cases(ctx.failures, node.id, cfg.cases))
        source = await _ask(ctx, prompt)
        if source.strip() == (node.source or "").strip():
            raise MutationError(f"rewrite_tool: the mutator returned the program of {node.id!r} unchanged")
        node = node.model_copy(update={"source": source})
        child = graph.replace_node(node)
        seen = [*ctx.failures, *ctx.successes]  # what the tool was given, failures first
        arguments = [_argument(s.shown) for f in seen for s in f.steps if s.node == node.id]
    await _try(node, arguments[:1], ctx)
    return child


async def _ask(ctx: MutationContext, prompt: str) -> str:
    """The program in the mutator's reply (its first python block, or the whole reply)."""
    req = GenerationRequest(({"role": "user", "content": prompt},), max_tokens=400, temperature=0.8,
                            seed=ctx.rng.getrandbits(62))
    (gen,) = await ctx.llm.generate([req])
    return strip_fences(gen.text).strip() + "\n"


async def _try(node: ToolNode, arguments: Sequence[str], ctx: MutationContext) -> None:
    """The new program compiles, defines ``main`` and runs in the sandbox on ``arguments``
    (one the tool was given: a failing execution's if there is one; none when no execution
    reached the tool, and then it is only compiled)."""
    try:
        check_source(node)
    except GraphError as e:
        raise MutationError(f"rewrite_tool: {e}") from None
    for argument in arguments:
        result = await run_python(program(node.source or "", argument), ctx.sandbox)
        if not result.ok:
            detail = (result.stderr.strip().splitlines() or [result.reason or ""])[-1]
            raise MutationError(f"rewrite_tool: the new program of {node.id!r} fails in the sandbox on an "
                                f"input the tool was given ({result.status}): {detail[:300]}")
