"""The two value objects every backend speaks, a request for one completion and its result,
``Usage``, what a backend's model has generated, and ``last_reply``, which says where the new
turns of a token-in request begin."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

Message = dict[str, str]  # {"role": "system" | "user" | "assistant", "content": "..."}


@dataclass(frozen=True)
class GenerationRequest:
    """One completion wanted for a chat. ``seed`` makes sampling reproducible per request.

    ``prefix_ids``, when given, are the exact ids of the conversation so far (the previous
    turn's prompt and completion ids) and ``messages`` ends with an assistant turn (that
    completion's text) plus new turns: the backend keeps the prefix verbatim and appends only the
    tokens of the new turns, so a multi-turn episode is one token stream in which every model
    token is exactly what was sampled (token-in/token-out; nothing earlier is re-tokenized).
    ``messages`` stays the whole chat: the cache key and the text of every turn. A backend
    must return ``prompt_ids`` that start with ``prefix_ids`` unless it had to truncate the
    prompt to its context window (the executor then ends the episode).

    ``continued`` is a hint, not part of what the model sees (nor of the cache key): a later
    request will extend this prompt and completion (a ``loop`` turn), so a backend may keep
    their KV for it.

    ``adapter`` (``rl.adapters: per_node``: the asking node's id) names the adapter to serve
    the request with; a backend that has none of that name serves its base weights. None: the
    weights every request shares.
    """

    messages: tuple[Message, ...]
    max_tokens: int = 64
    temperature: float = 0.0
    seed: int = 0
    stop: tuple[str, ...] = ()
    prefix_ids: tuple[int, ...] | None = None
    continued: bool = False
    adapter: str | None = None


@dataclass(frozen=True)
class Generation:
    """A completion with the exact tokens and their sampling logprobs.

    ``logprobs[i]`` is log p(completion_ids[i]) under the distribution the token was drawn
    from (the temperature-scaled softmax; greedy requests report temperature 1).
    """

    text: str
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str  # "stop" | "length"
    weights_version: int
    cached: bool = False


@dataclass
class Usage:
    """Completions a backend's model produced and their tokens (cache hits cost nothing): the
    unit a search's budget (``evolve.max_calls``) and the benchmarks' equal budgets count."""

    calls: int = 0
    tokens: int = 0
    # completions asked for, cache hits included: the same in a run resumed after a kill (whose
    # cache starts empty), so what ``rl.schedule`` measures a step's cost in
    requests: int = 0

    def add(self, generations: Sequence[Generation]) -> None:
        self.calls += len(generations)
        self.tokens += sum(len(g.completion_ids) for g in generations)


def last_reply(messages: Sequence[Message]) -> int:
    """Index of the last assistant turn: under ``prefix_ids`` the turns after it are the new
    ones a backend appends. A ValueError when there is none."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i]["role"] == "assistant":
            return i
    raise ValueError("prefix_ids needs an assistant turn in the request's messages")
