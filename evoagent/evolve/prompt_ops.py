"""Operators that change what a node says: reflective rewrite (GEPA / TextGrad) and few-shot
demo bootstrapping from successful executions (DSPy BootstrapFewShot, ExpeL).

As in GEPA, the rewrite reads the parent's failing executions node by node (every prompt, reply
and tool call, the reward's reason and its textual feedback) and may rewrite one node's system
instruction *and* its user template. A new template must keep every placeholder the old one
had and add none but ``{input}``, so the rewrite never breaks the graph's data flow; a template
that does not keep them is dropped and the instruction alone is kept.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from evoagent.errors import GraphError, MutationError
from evoagent.evolve.operators import Feedback, MutationContext, mutation
from evoagent.graph.model import AgentGraph, Demo, LLMNode, LoopNode
from evoagent.graph.validate import placeholders
from evoagent.llm.types import GenerationRequest

_MAX_INSTRUCTION = 1500
_SHOWN = 300  # characters of each prompt, reply or tool result shown to the mutator
REFLECT_PROMPT = """You improve one step of an AI agent.

Task: {task}

The agent's steps: {steps}. The step to improve is "{node}".
Its instructions:
\"\"\"{system}\"\"\"
Its message template ({{name}} is filled with the input or an earlier step's output):
\"\"\"{template}\"\"\"

Cases where the agent got it wrong, step by step:
{cases}

Write better instructions for step "{node}" so it gets such cases right. Reply in this form:
INSTRUCTIONS:
<the new instructions>
TEMPLATE:
<a new message template using the same {{names}}, or SAME to keep it>"""


def _prompt_nodes(graph: AgentGraph) -> list[LLMNode | LoopNode]:
    return [n for n in graph.nodes if isinstance(n, LLMNode | LoopNode)]


def _clip(text: str, n: int = _SHOWN) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


def case_text(f: Feedback) -> str:
    """One scored execution as the mutator reads it: input, each step, output, answer, feedback."""
    lines = [f"- Input: {_clip(f.input, 400)}"]
    for s in f.steps:
        if s.kind == "llm":
            lines.append(f"  [{s.node}] was shown: {_clip(s.shown)}")
            lines.append(f"  [{s.node}] replied: {_clip(s.produced)}")
        else:
            lines.append(f"  [{s.node}] called {_clip(s.shown, 120)} -> {_clip(s.produced, 160)}")
    got = f"error: {f.error}" if f.error else _clip(f.output)
    lines.append(f"  Agent output: {got}")
    lines.append(f"  Correct answer: {f.expected}  (reward {f.reward:.2f})")
    if f.feedback:
        lines.append(f"  Feedback: {_clip(f.feedback, 400)}")
    return "\n".join(lines)


def _cases(failures: Sequence[Feedback]) -> str:
    return "\n".join(case_text(f) for f in failures) or "- (no failures recorded)"


def clean_reply(text: str) -> str:
    """The instruction inside an LLM reply: fences, quotes and lead-ins stripped."""
    t = text.strip()
    if t.startswith("```"):
        t = t.strip("`").split("\n", 1)[-1]
    for lead in ("New instructions:", "Instructions:"):
        if t.lower().startswith(lead.lower()):
            t = t[len(lead) :]
    return t.strip().strip('"').strip()[:_MAX_INSTRUCTION]


def _marker(name: str) -> re.Pattern[str]:
    """A section marker as small models write it: ``TEMPLATE:``, ``**Template:**``, ``## TEMPLATE``."""
    return re.compile(rf"^[\s*#_`]*{name}[\s*_`]*:?[\s*_`]*", re.M | re.I)


_INSTRUCTIONS, _TEMPLATE = _marker("(?:new )?instructions"), _marker("(?:new )?template")


def parse_rewrite(text: str, truncated: bool = False) -> tuple[str, str | None]:
    """(instructions, template or None) from a reply in REFLECT_PROMPT's form; a reply
    without the markers is all instructions (small mutators often ignore the form). A reply
    cut off at its token limit gives no template: a truncated template could still keep its
    placeholders and lose the rest."""
    parts = _TEMPLATE.split(text, maxsplit=1)
    template = parts[1].strip().strip("`").strip() if len(parts) == 2 and not truncated else ""
    if template.upper() in ("", "SAME", "<SAME>"):
        template = ""
    return clean_reply(_INSTRUCTIONS.sub("", parts[0], count=1)), template or None


def _keeps_data_flow(old: str, new: str) -> bool:
    """The new template uses every placeholder of the old one and adds none but ``input``."""
    try:
        before, after = set(placeholders(old)), set(placeholders(new))
    except GraphError:
        return False
    return before <= after <= before | {"input"}


@mutation("reflective_rewrite")
async def reflective_rewrite(parents: Sequence[AgentGraph], ctx: MutationContext) -> AgentGraph:
    """Show the mutator LLM a node's prompt and the parent's failing traces; use its rewrite."""
    graph = parents[0]
    nodes = _prompt_nodes(graph)
    if not nodes:
        raise MutationError("reflective_rewrite: the graph has no llm or loop node")
    node = ctx.rng.choice(nodes)
    prompt = REFLECT_PROMPT.format(
        task=ctx.task, steps=" -> ".join(n.id for n in graph.nodes), node=node.id,
        system=node.system or "(none)", template=node.template, cases=_cases(ctx.failures),
    )
    req = GenerationRequest(
        ({"role": "user", "content": prompt},), max_tokens=240, temperature=0.8,
        seed=ctx.rng.getrandbits(62),
    )
    (gen,) = await ctx.llm.generate([req])
    system, template = parse_rewrite(gen.text, truncated=gen.finish_reason == "length")
    update: dict[str, str] = {}
    if system and system != node.system:
        update["system"] = system
    if template and template != node.template and _keeps_data_flow(node.template, template):
        update["template"] = template
    if not update:
        raise MutationError(f"reflective_rewrite: the mutator gave no new instruction ({gen.text[:80]!r})")
    return graph.replace_node(node.model_copy(update=update))


@mutation("bootstrap_demos")
def bootstrap_demos(parents: Sequence[AgentGraph], ctx: MutationContext) -> AgentGraph:
    """Add (prompt, reply) pairs from the parent's successful executions as few-shot demos; a
    node that already has ``max_demos`` gets one of them swapped for a fresh one (another demo
    set, as DSPy's random search over bootstrapped demos tries)."""
    graph = parents[0]
    if ctx.max_demos < 1:
        raise MutationError("bootstrap_demos: evolve.max_demos is 0")
    by_node: dict[str, list[Demo]] = {}
    for s in ctx.successes:
        for node_id, shown, said in s.node_io:
            by_node.setdefault(node_id, []).append(Demo(input=shown, output=said))
    fresh = {
        n.id: [d for d in dict.fromkeys(by_node.get(n.id, ())) if d not in n.demos]
        for n in graph.nodes if isinstance(n, LLMNode)
    }
    candidates = [n for n in graph.nodes if isinstance(n, LLMNode) and fresh[n.id]]
    if not candidates:
        why = "no successful execution of an llm node to learn from" if not by_node else (
            "every successful execution is already a demo")
        raise MutationError(f"bootstrap_demos: {why}")
    node = ctx.rng.choice(candidates)
    room = ctx.max_demos - len(node.demos)
    if room > 0:
        picked = ctx.rng.sample(fresh[node.id], min(room, len(fresh[node.id])))
        demos = node.demos + tuple(picked)
    else:
        demos = list(node.demos[: ctx.max_demos])
        demos[ctx.rng.randrange(len(demos))] = ctx.rng.choice(fresh[node.id])
        demos = tuple(demos)
    return graph.replace_node(node.model_copy(update={"demos": demos}))
