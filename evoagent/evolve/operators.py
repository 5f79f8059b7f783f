"""The mutation-operator extension point: a Protocol, a registry and the decorator users plug in.

An operator maps parent graphs plus a ``MutationContext`` to one child graph::

    @evoagent.mutation("shout", parents=1)
    def shout(parents, ctx):
        node = parents[0].node(parents[0].exit)
        return parents[0].replace_node(node.model_copy(update={"system": "ANSWER LOUDLY"}))

Contract: return a new ``AgentGraph`` (it may be sync or ``async``); never mutate the parents;
draw randomness only from ``ctx.rng``; raise ``MutationError`` when the operator does not apply
(the child is archived as invalid with that reason and the run goes on). Any other exception is
caught at the loop's candidate boundary and archived as ``crashed``; so is an operator that
runs past ``evolve.operator_timeout_s``: a synchronous plug-in runs in a worker process that is
then killed (``evoagent.usercode``; it gets no ``ctx.llm`` there, so an operator that calls the
LLM is ``async``), an async one is cancelled. task.yaml names operators by built-in name,
``module:function``, or an entry point in the ``evoagent.mutations`` group.
"""

from __future__ import annotations

import asyncio
import inspect
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel

from evoagent.errors import MutationError, SpecError, UserCodeError
from evoagent.execute.trajectory import LLMStep, Trajectory
from evoagent.graph.model import AgentGraph
from evoagent.llm.backend import Backend
from evoagent.llm.types import Usage
from evoagent.registry import Registry
from evoagent.spec.config import RunSpec
from evoagent.tools.sandbox import SandboxConfig
from evoagent.usercode import UserCode, preload, settle


@dataclass(frozen=True)
class TraceStep:
    """One step of an execution, in order: an llm node's last prompt message and its reply,
    or a tool call's argument and its output (or error)."""

    node: str
    kind: Literal["llm", "tool"]
    shown: str
    produced: str


@dataclass(frozen=True)
class Feedback:
    """One scored execution of a parent, as the mutator sees it (GEPA's reflective dataset):
    the whole trace node by node, the output, the expected answer, the reward and its words."""

    input: str
    output: str
    expected: str
    reward: float
    error: str | None
    steps: tuple[TraceStep, ...] = ()
    feedback: str | None = None  # the reward's textual feedback, when it gives one

    @classmethod
    def of(cls, t: Trajectory, expected: str) -> Feedback:
        """The mutator's view of one archived execution."""
        steps = tuple(
            TraceStep(s.node, "llm", s.messages[-1]["content"], s.text) if isinstance(s, LLMStep)
            else TraceStep(s.node, "tool", f"{s.tool}({s.argument})",
                           s.output if s.ok else f"error: {s.error}")
            for s in t.steps
        )
        return cls(t.input, t.output, expected, t.reward or 0.0, t.error, steps, t.feedback)

    @property
    def node_io(self) -> tuple[tuple[str, str, str], ...]:
        """(node id, prompt shown, text produced) of each llm step: demo material."""
        return tuple((s.node, s.shown, s.produced) for s in self.steps if s.kind == "llm")


@dataclass(frozen=True)
class MutationContext:
    """Everything an operator may use; no globals.

    Attributes:
        llm: the mutator backend (may differ from the policy).
        rng: seeded from (run seed, generation, child index): reruns reproduce.
        task: the task description from task.yaml.
        failures: the parent's worst scored executions (at most ``evolve.failures_shown``).
        successes: the parent's fully successful executions (demo material).
        tools: names of tools the task allows operators to insert.
        max_demos: most few-shot demos ``bootstrap_demos`` may give a node.
        extract: the task's answer extractor (``task.reward.extract``): what a vote compares.
        insights: the insight memory's best rules, most votes first (``evolve/insights.py``).
        history: call it for (graph, val score) of the archived agents under the current
            weights, those the cascade stopped with their minibatch score (param search's
            trials); a call, because it reads every graph of the archive.
        evaluate: ``await ctx.evaluate(graph, n)`` runs ``graph`` with the policy on ``n``
            train inputs drawn with ``rng`` and returns their rewards (nothing is archived;
            the completions count toward the budget): for operators that search by trying
            (``learn_edges``).
        sandbox: the task's sandbox limits, for an operator that runs the code it writes
            (``rewrite_tool`` tries its new tool there before it returns the child).
        settings: the operator's settings from its task.yaml entry (``params``), validated
            against the model it registered (``mutation(..., settings=Model)``); None for an
            operator without settings.
    """

    llm: Backend
    rng: random.Random
    task: str
    failures: tuple[Feedback, ...] = ()
    successes: tuple[Feedback, ...] = ()
    tools: tuple[str, ...] = ()
    max_demos: int = 3
    extract: str = "last_number"
    insights: tuple[str, ...] = ()
    history: Callable[[], Sequence[tuple[AgentGraph, float]]] = field(default=lambda: (), repr=False)
    evaluate: Callable[[AgentGraph, int], Awaitable[list[float]]] = field(
        default=lambda g, n: _no_evaluate(g, n), repr=False)
    settings: Any = None
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)


Check = Callable[[Sequence[AgentGraph], RunSpec], "str | None"]


@runtime_checkable
class MutationOperator(Protocol):
    """``(parents, ctx) -> AgentGraph`` (or an awaitable of one)."""

    def __call__(
        self, parents: Sequence[AgentGraph], ctx: MutationContext
    ) -> AgentGraph | Awaitable[AgentGraph]: ...


@dataclass(frozen=True)
class Operator:
    """A registered operator, how many parents it takes, and what it needs of the run:
    ``check(seed graphs, spec)`` says why it could never apply, or None. ``settings_model``
    (a pydantic model whose fields all have defaults) is what its task.yaml ``params`` may
    set; ``settings`` the validated values of one task.yaml entry (``configured``)."""

    name: str
    fn: MutationOperator
    parents: int = 1
    check: Check | None = None
    settings_model: type[BaseModel] | None = None
    settings: BaseModel | None = None

    def configured(self, params: Mapping[str, Any], field: str = "params") -> Operator:
        """This operator with ``params`` validated against its settings (defaults filled in);
        a SpecError naming ``field`` for an unknown key or a bad value."""
        from evoagent.spec.load import validate

        if self.settings_model is None:
            if params:
                raise SpecError(f"{field}: operator {self.name!r} takes no settings (got {sorted(params)})")
            return self
        return replace(self, settings=validate(self.settings_model, dict(params), field))

    async def apply(
        self, parents: Sequence[AgentGraph], ctx: MutationContext, user: UserCode | None = None,
        timeout_s: float | None = None,
    ) -> AgentGraph:
        """The child graph; a plug-in that runs past ``timeout_s`` raises UserCodeError."""
        what = f"operator {self.name!r}"
        if user is not None and not _builtin(self.fn) and not inspect.iscoroutinefunction(self.fn):
            portable = replace(ctx, llm=NoLLM(), history=_no_history, evaluate=_no_evaluate)
            child, rng = await user.call(self.fn, (list(parents), portable), timeout_s, what,
                                         wrap=_in_worker, answer=ctx.history)
            ctx.rng.setstate(rng)
        else:
            out = self.fn(parents, ctx)
            try:
                child = await asyncio.wait_for(out, timeout_s) if inspect.isawaitable(out) else out
            except TimeoutError:
                raise UserCodeError(f"{what} timed out after {timeout_s:g}s") from None
        if not isinstance(child, AgentGraph):
            raise MutationError(f"operator {self.name!r} returned {type(child).__name__}, not AgentGraph")
        return child


class NoLLM:
    """``ctx.llm`` of a synchronous operator in its worker process: no model there."""

    weights_version = 0
    usage = Usage()

    async def generate(self, requests: object) -> list:
        raise UserCodeError("a synchronous operator runs in its own process without the LLM; "
                            "make it async to use ctx.llm")

    async def aclose(self) -> None: ...


def _no_history() -> Sequence[tuple[AgentGraph, float]]:
    return ()


def _in_worker(fn: MutationOperator, args: Sequence[Any], ask: Callable[[], Any]) -> tuple[Any, Any]:
    """A synchronous plug-in in its worker process: ``ctx.history()`` asks the search process,
    and the state ``ctx.rng`` ends in comes back with the child, so the slot's RNG continues as
    it would have in process."""
    parents, ctx = args
    ctx = replace(ctx, history=ask)
    return settle(fn(parents, ctx)), ctx.rng.getstate()


preload(__name__)  # workers unpickle _in_worker and MutationContext: import them before any call


async def _no_evaluate(graph: AgentGraph, n: int) -> list[float]:
    raise UserCodeError("ctx.evaluate runs the policy, which only an async operator in the search "
                        "process can reach")


def _builtin(fn: object) -> bool:
    """evoagent's own operators run in this process: they are trusted not to hang."""
    return getattr(fn, "__module__", "").startswith("evoagent.")


REGISTRY: Registry[Operator] = Registry("operator", SpecError)  # read by ``evolve.catalog``


def mutation(
    name: str, *, parents: int = 1, check: Check | None = None, settings: type[BaseModel] | None = None,
) -> Callable[[MutationOperator], MutationOperator]:
    """Register a mutation operator under ``name`` (the public plug-in decorator).

    ``check(seed graphs, spec)``, run when the spec is checked, returns why the operator
    could never apply in this run (the spec error then names it), or None. ``settings``: a
    pydantic model of the operator's knobs, each with a default; task.yaml sets them in the
    operator's ``params``, checked when the spec is, and the operator reads them as
    ``ctx.settings``. A name is taken once: a plug-in that reuses a built-in's name is
    refused, not swapped in.
    """
    if parents < 1:
        raise ValueError("an operator needs at least one parent")

    def deco(fn: MutationOperator) -> MutationOperator:
        REGISTRY.add(name, Operator(name, fn, parents, check, settings))
        return fn

    return deco
