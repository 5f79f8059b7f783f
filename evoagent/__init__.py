"""evoagent: evolve LLM agent programs and fine-tune their policy model, in one loop.

Plug in a mutation operator with ``@evoagent.mutation("name")``; see ``evoagent.evolve.operators``.
"""

from evoagent.evolve.operators import Feedback, MutationContext, mutation

__all__ = ["Feedback", "MutationContext", "mutation"]
__version__ = "0.1.0"
