"""Which operator builds each child: ``fixed`` draws by the weights in task.yaml, ``adaptive``
is a bandit over operators that learns from the archive which ones still improve on parents.

A policy is ``fn(operators, outcomes, generation, cfg) -> choose``: given the configured
``(operator, weight)`` pairs and every archived child's outcome (``archive.views.Outcome``), it
returns ``choose(rng) -> Operator``, called once per draw with the slot's seeded RNG (so reruns
and ``--resume`` draw alike: the outcomes are read back from the archive, the only state).

``adaptive`` is Thompson sampling (as ShinkaEvolve's operator bandit): each operator's chance of
making a child that beats its parents is a Beta posterior over its past children, counted with
weight ``discount ** age`` (age in generations), so an operator that stopped applying (its
children invalid) or stopped improving loses its slots within a few generations, and one that
starts improving again wins them back. Each draw samples every posterior and takes the largest
sample times the operator's configured weight.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from evoagent.archive.views import Outcome
from evoagent.errors import SpecError
from evoagent.evolve.operators import Operator
from evoagent.registry import Registry
from evoagent.spec.config import OperatorPolicyConfig

Choose = Callable[[random.Random], Operator]
Policy = Callable[[Sequence[tuple[Operator, float]], Sequence[Outcome], int, OperatorPolicyConfig], Choose]
_REGISTRY: Registry[Policy] = Registry("operator policy", SpecError, field="evolve.operator_policy.kind")
operator_policy = _REGISTRY.register  # ``@operator_policy("name")``
known_policies = _REGISTRY.names
get_policy = _REGISTRY.get


@operator_policy("fixed")
def fixed(
    operators: Sequence[tuple[Operator, float]], outcomes: Sequence[Outcome], generation: int,
    cfg: OperatorPolicyConfig,
) -> Choose:
    """Draw by the configured weights, whatever the operators did."""
    ops, weights = zip(*operators)
    return lambda rng: rng.choices(ops, weights=weights, k=1)[0]


def posteriors(
    names: Sequence[str], outcomes: Sequence[Outcome], generation: int, discount: float
) -> dict[str, tuple[float, float]]:
    """Beta(a, b) per operator: 1 + discounted improvements, 1 + discounted other children."""
    post = {n: [1.0, 1.0] for n in names}
    for o in outcomes:
        if o.operator in post:
            w = discount ** max(0, generation - o.generation)
            post[o.operator][0 if o.improved else 1] += w
    return {n: (a, b) for n, (a, b) in post.items()}


@operator_policy("adaptive")
def adaptive(
    operators: Sequence[tuple[Operator, float]], outcomes: Sequence[Outcome], generation: int,
    cfg: OperatorPolicyConfig,
) -> Choose:
    """Thompson sampling over the operators' discounted improvement rates (module docstring)."""
    post = posteriors([op.name for op, _ in operators], outcomes, generation, cfg.discount)
    top = max(w for _, w in operators)

    def choose(rng: random.Random) -> Operator:
        draws = [(rng.betavariate(*post[op.name]) * w / top, i) for i, (op, w) in enumerate(operators)]
        return operators[max(draws)[1]][0]

    return choose
