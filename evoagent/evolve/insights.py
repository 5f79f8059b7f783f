"""ExpeL's insight memory: rules the mutator learns from pairs of a success and a failure on the
same input, kept with votes in the archive, injected into prompts by ``use_insights``.

After each generation (``evolve.memory.enabled``), inputs on which one archived execution of
this generation succeeded and another failed give up to ``evolve.memory.pairs`` (success,
failure) pairs. For each, the mutator sees the current numbered insights and both traces and
answers with operations, one per line, as in ExpeL (Zhao et al. 2024):

    ADD: <a new rule>
    EDIT 2: <rule 2, reworded>
    UPVOTE 1
    DOWNVOTE 3

A new rule starts with 2 votes, EDIT and UPVOTE add one, DOWNVOTE takes one; a rule at 0 votes
is dropped, and at most ``evolve.memory.max_insights`` are kept (most votes first). Lines that
are none of these (small mutators write prose too) are ignored. The insights are written with
the generation, so ``--resume`` continues from them, and ``evoagent run TASK --memory RUN``
starts a new run of the same task from another run's insights.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from evoagent.errors import MutationError
from evoagent.evolve.operators import Feedback, MutationContext, mutation
from evoagent.evolve.prompt_ops import case_text
from evoagent.execute.trajectory import Trajectory
from evoagent.graph.model import AgentGraph, LLMNode
from evoagent.llm.backend import Backend
from evoagent.llm.types import GenerationRequest
from evoagent.spec.config import RunSpec

NEW_VOTES = 2
HEADER = "Lessons from earlier attempts:"
EXTRACT_PROMPT = """You maintain a short list of general rules that help an AI agent solve tasks.

Task: {task}

Current rules:
{rules}

The agent succeeded on this case:
{success}

and failed on this one (the same input, another version of the agent):
{failure}

What general rule explains the difference? Reply with operations, one per line:
ADD: <a new general rule>
EDIT <number>: <a better wording of that rule>
UPVOTE <number>
DOWNVOTE <number>"""
_OPS = re.compile(r"^\W*(ADD|EDIT|UPVOTE|DOWNVOTE)\b\s*(\d+)?\s*:?\s*(.*)$", re.I)


@dataclass(frozen=True)
class Insight:
    text: str
    votes: int


def apply_operations(insights: Sequence[Insight], reply: str, max_insights: int) -> list[Insight]:
    """``insights`` after the operations in ``reply`` (other lines ignored)."""
    rules = [[i.text, i.votes] for i in insights]
    for line in reply.splitlines():
        m = _OPS.match(line.strip())
        if not m:
            continue
        op, num, text = m.group(1).upper(), m.group(2), " ".join(m.group(3).split())[:300]
        k = int(num) - 1 if num else -1
        if op == "ADD" and text and text.lower() not in {r[0].lower() for r in rules}:
            rules.append([text, NEW_VOTES])
        elif 0 <= k < len(rules) and op == "EDIT" and text:
            rules[k] = [text, rules[k][1] + 1]
        elif 0 <= k < len(rules) and op in ("UPVOTE", "DOWNVOTE"):
            rules[k][1] += 1 if op == "UPVOTE" else -1
    kept = sorted((Insight(t, v) for t, v in rules if v > 0), key=lambda i: -i.votes)
    return kept[:max_insights]


def contrast_pairs(
    fresh: Sequence[Trajectory], archived: Sequence[Trajectory], n: int
) -> list[tuple[Trajectory, Trajectory]]:
    """Up to ``n`` (success, failure) pairs of two agents on the same input, one side from this
    generation's executions (``fresh``), the other from them or the archive; in input order."""
    new: dict[str, list[Trajectory]] = {}
    for t in fresh:
        new.setdefault(t.input_id, []).append(t)
    pairs = []
    for inp in sorted(new):
        pool = new[inp] + [t for t in archived if t.input_id == inp]
        for t in new[inp]:
            won = (t.reward or 0) >= 1.0
            other = next((o for o in pool if o.agent_id != t.agent_id and ((o.reward or 0) >= 1.0) != won), None)
            if other is not None:
                pairs.append((t, other) if won else (other, t))
                break
    return pairs[:n]


async def learn(
    insights: Sequence[Insight], pairs: Sequence[tuple[Feedback, Feedback]], llm: Backend, task: str,
    max_insights: int, seed: int,
) -> list[Insight]:
    """One round of ExpeL's extraction: the mutator's operations for each pair, applied in turn."""
    out = list(insights)
    for k, (good, bad) in enumerate(pairs):
        rules = "\n".join(f"{i + 1}. {r.text} ({r.votes} votes)" for i, r in enumerate(out)) or "(none yet)"
        prompt = EXTRACT_PROMPT.format(task=task, rules=rules, success=case_text(good), failure=case_text(bad))
        (gen,) = await llm.generate([GenerationRequest(({"role": "user", "content": prompt},), 160, 0.7, seed + k)])
        out = apply_operations(out, gen.text, max_insights)
    return out


def render(texts: Sequence[str]) -> str:
    return HEADER + "\n" + "\n".join(f"- {t}" for t in texts)


def needs_memory(seeds: Sequence[AgentGraph], spec: RunSpec) -> str | None:
    """Spec check: the memory ``use_insights`` reads is kept."""
    if not spec.evolve.memory.enabled:
        return "use_insights injects the insight memory, and evolve.memory.enabled is false"
    return None


@mutation("use_insights", check=needs_memory)
def use_insights(parents: Sequence[AgentGraph], ctx: MutationContext) -> AgentGraph:
    """Give an llm node the memory's best insights (``ctx.insights``) under its instructions,
    replacing the ones an earlier ``use_insights`` put there."""
    if not ctx.insights:
        raise MutationError("use_insights: the memory holds no insights yet")
    graph = parents[0]
    block = render(ctx.insights)
    targets = [n for n in graph.nodes if isinstance(n, LLMNode) and block not in n.system]
    if not targets:
        raise MutationError("use_insights: every llm node already has the current insights")
    node = ctx.rng.choice(targets)
    base = node.system.split(HEADER)[0].rstrip()
    return graph.replace_node(node.model_copy(update={"system": f"{base}\n\n{block}".strip()}))
