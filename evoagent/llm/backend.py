"""The backend extension point: one async ``generate`` over a batch, plus a registry by name
that implementations add themselves to (``register_backend``) and ``llm.factory`` reads.

A backend turns ``GenerationRequest``s into ``Generation``s, in order, one per request. It may
batch, cache or reorder internally but must return results aligned with the requests. A request
that cannot be served because the model itself is unusable raises ``BackendError``; a prompt
that is merely too long is truncated from the left and still answered.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

from evoagent.errors import BackendError
from evoagent.llm.types import Generation, GenerationRequest, Usage
from evoagent.registry import Registry
from evoagent.spec.config import BackendConfig


@runtime_checkable
class Backend(Protocol):
    """Serves completions; ``weights_version`` names the weights the next call will use and
    ``usage`` counts what the model generated (``through_cache`` keeps it)."""

    weights_version: int
    usage: Usage

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class SupportsTraining(Protocol):
    """A backend whose policy RL can train: it hands out a transformers copy of the policy to
    train, and serves that copy's weights when told to (weight sync)."""

    pad_id: int

    def trainable_model(self) -> Any:
        """The torch module to train (the same object on every call)."""

    def sync_weights(self, model: Any) -> None:
        """Serve ``model``'s weights (the trained copy, LoRA adapter or not) from the next
        request on; nothing generated under the old weights is served again."""


@dataclass(frozen=True)
class TrainingNeeds:
    """What RL will ask of the policy backend, as the few plain facts a backend checks (the
    RL config itself stays a floor above)."""

    lora_rank: int
    full_finetune: bool
    per_node: bool  # one adapter per llm node (rl.adapters: per_node)


B = TypeVar("B")
BackendFactory = Callable[[BackendConfig], Backend]
Preflight = Callable[[BackendConfig, str], None]  # (config, spec field) -> raises BackendError
TrainCheck = Callable[[BackendConfig, TrainingNeeds], str | None]  # -> why RL cannot train it, or None


@dataclass(frozen=True)
class BackendEntry:
    """A registered backend: how to build it, whether RL can train it, and a cheap check run
    before any model loads (a package missing, a server that does not answer)."""

    factory: BackendFactory
    trainable: bool  # instances can implement SupportsTraining (RL trains a copy in this process)
    preflight: Preflight | None = None
    train_check: TrainCheck | None = None  # what this backend needs of the policy and rl configs


REGISTRY: Registry[BackendEntry] = Registry("backend", BackendError)  # read by ``llm.factory``


def register_backend(
    name: str, *, trainable: bool = False, preflight: Preflight | None = None,
    train_check: TrainCheck | None = None,
) -> Callable[[B], B]:
    """Register a backend factory (a class or function taking a ``BackendConfig``).

    ``trainable=True`` promises that what the factory builds implements ``SupportsTraining``
    (given a config ``train_check`` accepts); the spec check uses it to refuse ``rl.enabled``
    on a backend that cannot be trained. ``train_check(policy, needs)`` returns why this
    policy config cannot be trained as ``needs`` asks (a message naming the field), or None.
    ``preflight(cfg, field)`` runs before the search starts and raises ``BackendError``
    naming ``field`` when the backend cannot work.
    """

    def deco(factory: B) -> B:
        REGISTRY.add(name, BackendEntry(factory, trainable, preflight, train_check))  # type: ignore[arg-type]
        return factory

    return deco


def lora_fits(policy: BackendConfig, rl: TrainingNeeds) -> str | None:
    """Train check of the backends that serve adapters (vllm, openai): the adapter RL trains
    is one they can serve."""
    if not rl.full_finetune and rl.lora_rank > policy.max_lora_rank:
        return (f"rl.lora_rank: {rl.lora_rank} exceeds policy.max_lora_rank ({policy.max_lora_rank}), "
                f"the largest adapter the {policy.kind} backend serves")
    return None


def total_usage(backends: Sequence[Backend]) -> Usage:
    """What these backends' models generated together (a backend listed twice counts once)."""
    out = Usage()
    for b in {id(b): b for b in backends}.values():
        out.calls += b.usage.calls
        out.tokens += b.usage.tokens
        out.requests += b.usage.requests
    return out
