"""Chat messages to prompt token ids with a Hugging Face tokenizer's chat template, for every
backend that tokenizes on our side (``hf``, ``vllm``).

``prompt(request)`` renders the whole chat, or, under ``prefix_ids`` (token-in/token-out), keeps
the prefix verbatim and tokenizes only what follows the last assistant turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from evoagent.errors import BackendError
from evoagent.llm.types import GenerationRequest, Message, last_reply

_MARK = "\x00evoagent-turn\x00"  # stands for an assistant turn's content in ``continuation``


class ChatTokens:
    """Renders chats with ``tokenizer``'s template; ``system_prompt`` replaces the template's
    default system message when a chat has none; prompts keep their last ``max_context`` ids."""

    def __init__(self, tokenizer: Any, eos_ids: set[int], system_prompt: str, max_context: int) -> None:
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.system_prompt = system_prompt
        self.max_context = max_context

    def render(self, messages: Sequence[Message]) -> list[int]:
        """Chat-template token ids ending with the assistant header (generation prompt)."""
        enc = self.tokenizer.apply_chat_template(
            self._with_system(messages), add_generation_prompt=True, tokenize=True
        )
        ids = enc["input_ids"] if not isinstance(enc, list) else enc
        return list(ids)

    def continuation(self, messages: Sequence[Message], after_eos: bool) -> list[int]:
        """Token ids that follow the last assistant turn of ``messages``: the end of that turn
        (unless the model already emitted it, ``after_eos``), the later turns, and the next
        assistant header. Only these are tokenized; the ids before stay as sampled.

        The template renders the chat with a marker for the last assistant turn's content, and
        everything after the marker is the continuation: the closing of that turn is read off
        the template itself rather than assumed. Templates that render earlier turns
        differently once more turns follow (Qwen3 drops the empty think block) are fine: only
        the text after the marker is used, and the ids before it stay as sampled.
        """
        try:
            last = last_reply(messages)
        except ValueError as e:
            raise BackendError(str(e)) from None
        head = [*self._with_system(messages[:last]), {"role": "assistant", "content": _MARK}]
        full = self.tokenizer.apply_chat_template(
            [*head, *messages[last + 1 :]], tokenize=False, add_generation_prompt=True
        )
        if _MARK not in full:
            raise BackendError("the chat template drops the assistant turn; token-in is impossible")
        text = full[full.rindex(_MARK) + len(_MARK) :]
        if after_eos:
            for t in self.tokenizer.convert_ids_to_tokens(sorted(self.eos_ids)):
                if isinstance(t, str) and text.startswith(t):
                    text = text[len(t) :]
                    break
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt(self, r: GenerationRequest) -> list[int]:
        """The request's prompt ids, left-truncated to leave room for its token budget (a
        caller that extends a prefix sees the truncation: the prefix is no longer a prefix)."""
        if r.prefix_ids is None:
            ids = self.render(r.messages)
        else:
            after_eos = bool(r.prefix_ids) and r.prefix_ids[-1] in self.eos_ids
            ids = [*r.prefix_ids, *self.continuation(r.messages, after_eos)]
        keep = max(1, self.max_context - r.max_tokens)
        return ids[-keep:]

    def text(self, r: GenerationRequest, tokens: Sequence[int]) -> str:
        """The completion's text, cut at the first stop string."""
        text = self.tokenizer.decode(list(tokens), skip_special_tokens=True)
        for s in r.stop:
            if s in text:
                text = text[: text.index(s)]
        return text.strip()

    def hit_stop(self, r: GenerationRequest, tokens: Sequence[int]) -> bool:
        """Whether the last few tokens spell one of the request's stop strings."""
        if not r.stop:
            return False
        tail = self.tokenizer.decode(list(tokens[-8:]), skip_special_tokens=True)
        return any(s in tail for s in r.stop)

    def _with_system(self, messages: Sequence[Message]) -> list[Message]:
        msgs = list(messages)
        if self.system_prompt and not any(m["role"] == "system" for m in msgs):
            msgs = [{"role": "system", "content": self.system_prompt}, *msgs]
        return msgs


def eos_ids(model: Any, tokenizer: Any) -> set[int]:
    """Every id that ends a completion: the tokenizer's and the generation config's."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(gen_eos, int):
        ids.add(gen_eos)
    elif isinstance(gen_eos, list):
        ids.update(gen_eos)
    if not ids:
        raise BackendError("the tokenizer has no end-of-sequence token")
    return ids
