"""Build backends by name: the backend registry (``llm.backend``), filled with the built-in
implementations from here, the one place above them, so that no implementation is imported by
the module it registers with. They are imported when a name is first looked up, so torch loads
only when a model is wanted.
"""

from __future__ import annotations

from evoagent.llm.backend import REGISTRY, Backend, TrainingNeeds
from evoagent.spec.config import BackendConfig

__all__ = ["TrainingNeeds", "backend_entry", "known_backends", "make_backend", "make_backends"]


def _load_builtins() -> None:
    """Import the built-in backends: each registers itself (``openai`` from ``served_lora``,
    which builds a trainable served policy when ``weights`` is set)."""
    from evoagent.llm import hf, scripted, served_lora, vllm  # noqa: F401


BACKENDS = REGISTRY.loading(_load_builtins)
known_backends = BACKENDS.names  # the registered backends' names, sorted
backend_entry = BACKENDS.get  # ``kind``'s entry; an unknown kind lists the known ones


def make_backend(cfg: BackendConfig) -> Backend:
    """Build the backend named by ``cfg.kind``; an unknown kind lists the known ones."""
    return backend_entry(cfg.kind).factory(cfg)


def make_backends(policy: BackendConfig, mutator: BackendConfig | None) -> tuple[Backend, Backend]:
    """The policy and mutator backends; one object serves both when the mutator is unset or
    configured like the policy (one model in memory, one cache)."""
    served = make_backend(policy)
    return served, served if mutator is None or mutator == policy else make_backend(mutator)
