"""The backend extension point: one async ``generate`` over a batch, plus a registry by name.

A backend turns ``GenerationRequest``s into ``Generation``s, in order, one per request. It may
batch, cache or reorder internally but must return results aligned with the requests. A request
that cannot be served because the model itself is unusable raises ``BackendError``; a prompt
that is merely too long is truncated from the left and still answered.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from evoagent.errors import BackendError
from evoagent.llm.types import Generation, GenerationRequest, Usage
from evoagent.registry import Registry
from evoagent.spec.config import BackendConfig

if TYPE_CHECKING:
    from evoagent.rl.config import RLConfig


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


B = TypeVar("B")
BackendFactory = Callable[[BackendConfig], Backend]
Preflight = Callable[[BackendConfig, str], None]  # (config, spec field) -> raises BackendError
TrainCheck = Callable[[BackendConfig, "RLConfig"], str | None]  # -> why RL cannot train it, or None


@dataclass(frozen=True)
class BackendEntry:
    """A registered backend: how to build it, whether RL can train it, and a cheap check run
    before any model loads (a package missing, a server that does not answer)."""

    factory: BackendFactory
    trainable: bool  # instances can implement SupportsTraining (RL trains a copy in this process)
    preflight: Preflight | None = None
    train_check: TrainCheck | None = None  # what this backend needs of the policy and rl configs


_REGISTRY: Registry[BackendEntry] = Registry("backend", BackendError)


def register_backend(
    name: str, *, trainable: bool = False, preflight: Preflight | None = None,
    train_check: TrainCheck | None = None,
) -> Callable[[B], B]:
    """Register a backend factory (a class or function taking a ``BackendConfig``).

    ``trainable=True`` promises that what the factory builds implements ``SupportsTraining``
    (given a config ``train_check`` accepts); the spec check uses it to refuse ``rl.enabled``
    on a backend that cannot be trained. ``train_check(policy, rl)`` returns why this policy
    config cannot be trained under ``rl`` (a message naming the field), or None.
    ``preflight(cfg, field)`` runs before the search starts and raises ``BackendError``
    naming ``field`` when the backend cannot work.
    """

    def deco(factory: B) -> B:
        _REGISTRY.add(name, BackendEntry(factory, trainable, preflight, train_check))  # type: ignore[arg-type]
        return factory

    return deco


def lora_fits(policy: BackendConfig, rl: RLConfig) -> str | None:
    """Train check of the backends that serve adapters (vllm, openai): the adapter RL trains
    is one they can serve."""
    if not rl.full_finetune and rl.lora_rank > policy.max_lora_rank:
        return (f"rl.lora_rank: {rl.lora_rank} exceeds policy.max_lora_rank ({policy.max_lora_rank}), "
                f"the largest adapter the {policy.kind} backend serves")
    return None


def known_backends() -> list[str]:
    """Names of the registered backends, sorted."""
    _load_builtins()
    return _REGISTRY.names()


def backend_entry(kind: str) -> BackendEntry:
    """The registry entry of ``kind``; an unknown kind lists the known ones."""
    _load_builtins()
    return _REGISTRY.get(kind)


def make_backend(cfg: BackendConfig) -> Backend:
    """Build the backend named by ``cfg.kind``; an unknown kind lists the known ones."""
    return backend_entry(cfg.kind).factory(cfg)


def make_backends(policy: BackendConfig, mutator: BackendConfig | None) -> tuple[Backend, Backend]:
    """The policy and mutator backends; one object serves both when the mutator is unset or
    configured like the policy (one model in memory, one cache)."""
    served = make_backend(policy)
    return served, served if mutator is None or mutator == policy else make_backend(mutator)


def total_usage(backends: Sequence[Backend]) -> Usage:
    """What these backends' models generated together (a backend listed twice counts once)."""
    out = Usage()
    for b in {id(b): b for b in backends}.values():
        out.calls += b.usage.calls
        out.tokens += b.usage.tokens
    return out


def _load_builtins() -> None:
    """Import the built-in backends lazily so torch loads only when a model is wanted."""
    from evoagent.llm import hf, openai, scripted, vllm  # noqa: F401
