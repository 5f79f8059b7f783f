"""Operators that change what a node says: reflective rewrite (GEPA / TextGrad) and few-shot
demo bootstrapping from successful executions (DSPy BootstrapFewShot, ExpeL).

Departure from GEPA: one node's *system instruction* is rewritten and its user template is
kept, so the rewrite can never break the graph's data flow (placeholders stay valid).
"""

from __future__ import annotations

from collections.abc import Sequence

from evoagent.errors import MutationError
from evoagent.evolve.operators import Feedback, MutationContext, mutation
from evoagent.graph.model import AgentGraph, Demo, LLMNode, LoopNode
from evoagent.llm.types import GenerationRequest

_MAX_INSTRUCTION = 1500
REFLECT_PROMPT = """You improve the instructions of one step of an AI agent.

Task: {task}

Current instructions for this step:
\"\"\"{system}\"\"\"

The step receives: {template}

Cases where the agent got it wrong:
{cases}

Write better instructions for this step so it gets such cases right. Reply with the new
instructions only."""


def _prompt_nodes(graph: AgentGraph) -> list[LLMNode | LoopNode]:
    return [n for n in graph.nodes if isinstance(n, LLMNode | LoopNode)]


def _cases(failures: Sequence[Feedback]) -> str:
    out = []
    for f in failures:
        got = f"error: {f.error}" if f.error else f.output[:300]
        out.append(f"- Input: {f.input[:400]}\n  Agent output: {got}\n  Correct answer: {f.expected}")
    return "\n".join(out) or "- (no failures recorded)"


def clean_reply(text: str) -> str:
    """The instruction inside an LLM reply: fences, quotes and lead-ins stripped."""
    t = text.strip()
    if t.startswith("```"):
        t = t.strip("`").split("\n", 1)[-1]
    for lead in ("New instructions:", "Instructions:"):
        if t.lower().startswith(lead.lower()):
            t = t[len(lead) :]
    return t.strip().strip('"').strip()[:_MAX_INSTRUCTION]


@mutation("reflective_rewrite")
async def reflective_rewrite(parents: Sequence[AgentGraph], ctx: MutationContext) -> AgentGraph:
    """Show the mutator LLM a node's instruction and the parent's failures; use its rewrite."""
    graph = parents[0]
    nodes = _prompt_nodes(graph)
    if not nodes:
        raise MutationError("reflective_rewrite: the graph has no llm or loop node")
    node = ctx.rng.choice(nodes)
    prompt = REFLECT_PROMPT.format(
        task=ctx.task, system=node.system or "(none)", template=node.template, cases=_cases(ctx.failures)
    )
    req = GenerationRequest(
        ({"role": "user", "content": prompt},), max_tokens=160, temperature=0.8,
        seed=ctx.rng.getrandbits(62),
    )
    (gen,) = await ctx.llm.generate([req])
    new = clean_reply(gen.text)
    if not new or new == node.system:
        raise MutationError(f"reflective_rewrite: the mutator gave no new instruction ({gen.text[:80]!r})")
    return graph.replace_node(node.model_copy(update={"system": new}))


@mutation("bootstrap_demos")
def bootstrap_demos(parents: Sequence[AgentGraph], ctx: MutationContext) -> AgentGraph:
    """Add (prompt, reply) pairs from the parent's successful executions as few-shot demos."""
    graph = parents[0]
    by_node: dict[str, list[Demo]] = {}
    for s in ctx.successes:
        for node_id, shown, said in s.node_io:
            by_node.setdefault(node_id, []).append(Demo(input=shown, output=said))
    candidates = [
        n for n in graph.nodes
        if isinstance(n, LLMNode) and by_node.get(n.id) and len(n.demos) < ctx.max_demos
    ]
    if not candidates:
        raise MutationError("bootstrap_demos: no successful execution of an llm node to learn from")
    node = ctx.rng.choice(candidates)
    fresh = [d for d in dict.fromkeys(by_node[node.id]) if d not in node.demos]
    room = ctx.max_demos - len(node.demos)
    picked = ctx.rng.sample(fresh, min(room, len(fresh)))
    if not picked:
        raise MutationError(f"bootstrap_demos: node {node.id!r} already has these demos")
    return graph.replace_node(node.model_copy(update={"demos": node.demos + tuple(picked)}))
