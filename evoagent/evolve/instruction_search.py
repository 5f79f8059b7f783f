"""Which instruction and which demos go together: ``instruction_demo_search``, in the manner of
DSPy's MIPROv2 (Opsahl-Ong et al. 2024).

For one llm node, the mutator proposes ``instructions`` new instructions, each from the task,
the node's current instruction and the parent's failing executions; ``demo_sets`` demo sets are
drawn from the parent's successful executions of that node (bootstrapped, as DSPy does). The
node's own instruction and demos are candidates too, and their pair is the first trial: the
bar to beat. optuna's TPE then proposes (instruction, demo set) pairs until ``trials`` distinct
pairs (or all there are) are scored, each on the same ``inputs`` train inputs (``ctx.evaluate``:
a paired comparison; the completions count toward the run's budget), and the best pair becomes
the child. A pair proposed again is told its score without running it. Cost per child: ``instructions``
mutator completions plus at most ``trials x inputs`` executions.
"""

from __future__ import annotations

from collections.abc import Sequence

import optuna
from pydantic import BaseModel, ConfigDict, Field

from evoagent.errors import MutationError
from evoagent.evolve.operators import MutationContext, mutation
from evoagent.evolve.prompt_ops import case_text, clean_reply
from evoagent.graph.model import AgentGraph, Demo, LLMNode
from evoagent.llm.types import GenerationRequest
from evoagent.spec.config import RunSpec

ASKS = 8  # TPE proposals per pair to score, at most (repeats are told their earlier score)
PROPOSE = """You write the instruction of one step of an AI agent.

The task: {task}
The step's current instruction: {system}
The step is shown: {template}

Executions the agent got wrong:
{cases}

Write a better instruction for this step: one short paragraph, no examples. Reply with the
instruction only."""


class InstructionDemoSettings(BaseModel):
    """``instruction_demo_search``'s settings; a child costs ``instructions`` mutator
    completions plus at most ``trials x inputs`` executions on train inputs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    instructions: int = Field(4, ge=1, le=16, description="new instructions the mutator proposes")
    demo_sets: int = Field(4, ge=1, le=16, description="demo sets drawn from the parent's successes")
    trials: int = Field(8, ge=2, le=64, description="(instruction, demo set) pairs TPE tries")
    inputs: int = Field(8, ge=1, le=64, description="train inputs each pair is scored on (the same for all)")


def needs_train(seeds: Sequence[AgentGraph], spec: RunSpec) -> str | None:
    """Spec check: the pairs are scored on train inputs, so there must be some."""
    if spec.task.splits.train == 0:
        return "instruction_demo_search scores its pairs on train inputs, and task.splits.train is 0"
    return None


@mutation("instruction_demo_search", check=needs_train, settings=InstructionDemoSettings)
async def instruction_demo_search(parents: Sequence[AgentGraph], ctx: MutationContext) -> AgentGraph:
    """The best (instruction, demo set) pair for one llm node, found by TPE on train minibatches."""
    graph = parents[0]
    cfg: InstructionDemoSettings = ctx.settings or InstructionDemoSettings()
    nodes = [n for n in graph.nodes if isinstance(n, LLMNode)]
    if not nodes:
        raise MutationError("instruction_demo_search: the graph has no llm node")
    node = ctx.rng.choice(nodes)
    instructions = [node.system, *await _propose(node, ctx, cfg.instructions)]
    demo_sets = [node.demos, *_demo_sets(node, ctx, cfg.demo_sets)]
    instructions, demo_sets = list(dict.fromkeys(instructions)), list(dict.fromkeys(demo_sets))

    def pair(i: int, d: int) -> AgentGraph:
        return graph.replace_node(node.model_copy(update={"system": instructions[i], "demos": demo_sets[d]}))

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = optuna.samplers.TPESampler(seed=ctx.rng.getrandbits(31), n_startup_trials=min(4, cfg.trials))
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.enqueue_trial({"instruction": 0, "demos": 0})  # the node as it is: the bar to beat
    draw = ctx.rng.getstate()  # every pair is scored on the inputs this state draws
    scored: dict[tuple[int, int], float] = {}
    want = min(cfg.trials, len(instructions) * len(demo_sets))
    if want < 2:
        raise MutationError(f"instruction_demo_search: nothing to try for node {node.id!r}: the mutator proposed "
                            "no new instruction and the parent has no success to draw demos from")
    for _ in range(ASKS * cfg.trials):  # TPE may propose a pair again: that costs nothing
        if len(scored) >= want:
            break
        trial = study.ask()
        key = (trial.suggest_categorical("instruction", list(range(len(instructions)))),
               trial.suggest_categorical("demos", list(range(len(demo_sets)))))
        if key not in scored:
            ctx.rng.setstate(draw)
            rewards = await ctx.evaluate(pair(*key), cfg.inputs)
            scored[key] = sum(rewards) / max(len(rewards), 1)
        study.tell(trial, scored[key])
    best = max(scored, key=lambda k: (scored[k], -k[0], -k[1]))  # ties: the earlier candidates
    if scored[best] <= scored[(0, 0)]:
        raise MutationError(f"instruction_demo_search: no pair beat node {node.id!r}'s own instruction and "
                            f"demos on {cfg.inputs} train inputs ({len(scored)} pairs tried)")
    return pair(*best)


async def _propose(node: LLMNode, ctx: MutationContext, n: int) -> list[str]:
    """``n`` instructions from the mutator, each grounded in the task and the failures."""
    prompt = PROPOSE.format(task=ctx.task, system=node.system or "(none)", template=node.template,
                            cases="\n".join(case_text(f) for f in ctx.failures[:3]) or "- (none recorded)")
    reqs = [GenerationRequest(({"role": "user", "content": prompt},), max_tokens=160, temperature=1.0,
                              seed=ctx.rng.getrandbits(62)) for _ in range(n)]
    return [t for t in (clean_reply(g.text) for g in await ctx.llm.generate(reqs)) if t]


def _demo_sets(node: LLMNode, ctx: MutationContext, n: int) -> list[tuple[Demo, ...]]:
    """``n`` demo sets of up to ``ctx.max_demos`` demos each from the parent's successful
    executions of ``node`` (none when it has no success there)."""
    pool = list(dict.fromkeys(Demo(input=shown, output=said) for f in ctx.successes
                              for node_id, shown, said in f.node_io if node_id == node.id))
    if not pool or ctx.max_demos < 1:
        return []
    k = min(ctx.max_demos, len(pool))
    order = {d: i for i, d in enumerate(pool)}  # a set in pool order: two draws of one set are one candidate
    return [tuple(sorted(ctx.rng.sample(pool, k), key=order.__getitem__)) for _ in range(n)]
