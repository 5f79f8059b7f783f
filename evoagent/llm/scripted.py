"""A real backend whose completions come from a Python function: tests and dry runs stay offline
and deterministic (the httpx ``MockTransport`` idea). The handler runs in a worker thread, as a
real model call would, so timeouts around it behave as they do in production.

``handler(request) -> str`` decides the reply; tokens are the UTF-8 bytes of the rendered chat
and of the reply, and every logprob is 0.0 (the reply is certain). Used through the registry as
``kind: scripted`` it echoes the last user message, which is enough to run a whole pipeline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from evoagent.llm.backend import register_backend
from evoagent.llm.types import Generation, GenerationRequest, Usage, last_reply
from evoagent.spec.config import BackendConfig

Handler = Callable[[GenerationRequest], str]


def echo(request: GenerationRequest) -> str:
    """Reply with the last user message (the default handler)."""
    users = [m["content"] for m in request.messages if m["role"] == "user"]
    return users[-1] if users else ""


def byte_ids(text: str) -> tuple[int, ...]:
    return tuple(text.encode())


def _prompt(r: GenerationRequest) -> tuple[int, ...]:
    """The chat's bytes; under ``prefix_ids``, the prefix plus the bytes of the turns after the
    last assistant turn (the token-in contract of ``GenerationRequest``)."""
    if r.prefix_ids is None:
        return byte_ids("".join(m["content"] for m in r.messages))
    last = last_reply(r.messages)
    return r.prefix_ids + byte_ids("".join(m["content"] for m in r.messages[last + 1 :]))


@register_backend("scripted")
class ScriptedBackend:
    """Serves completions computed by ``handler``; records every request it saw."""

    def __init__(self, cfg: BackendConfig | None = None, handler: Handler = echo) -> None:
        self.handler = handler
        self.weights_version = 0
        self.requests: list[GenerationRequest] = []
        self.usage = Usage()

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        out = []
        for r in requests:
            self.requests.append(r)
            text = (await asyncio.to_thread(self.handler, r))[: max(r.max_tokens * 4, 1)]
            prompt = _prompt(r)
            ids = byte_ids(text)
            out.append(
                Generation(
                    text=text,
                    prompt_ids=tuple(prompt),
                    completion_ids=ids,
                    logprobs=(0.0,) * len(ids),
                    finish_reason="stop",
                    weights_version=self.weights_version,
                )
            )
        self.usage.add(out)
        self.usage.requests += len(requests)
        return out

    async def aclose(self) -> None:
        return None
