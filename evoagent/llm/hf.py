"""The in-process transformers backend: the embedded default (SmolLM2-135M-Instruct) or any HF
causal-LM folder, with request batching, a completion cache and in-place weight sync.

Generation is a plain KV-cached decode loop rather than ``model.generate`` because each request
needs its own temperature, token budget, stop strings and, above all, its own seeded RNG: a
request's draws must not depend on which other requests shared its batch, or caching and
``--resume`` would not reproduce. What the RNG cannot fix: bfloat16 matmuls round differently
for different batch shapes (shared/facts/stack.md), so under ``dtype: bfloat16`` a request
may come out a few tokens different in another batch; ``dtype: float32`` is batch-invariant
(tested) and is the choice where exact replay matters. Prompts are left-padded; logprobs are
``log_softmax(logits / T)`` of the sampled token (T = 1 for greedy requests), in float32.

Weight sync is free: the RL trainer wraps ``trainable_model()`` with LoRA in place, so the next
generate call already samples from the updated policy; the trainer then bumps
``weights_version`` so cached completions of the old weights stop matching.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from evoagent.errors import BackendError
from evoagent.llm.backend import register_backend
from evoagent.llm.batcher import Batcher
from evoagent.llm.cache import GenerationCache
from evoagent.llm.embedded import EMBEDDED_NAME, embedded_model_dir
from evoagent.llm.types import Generation, GenerationRequest, Message, last_reply
from evoagent.memory import release_memory
from evoagent.spec.config import BackendConfig

_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
_MARK = "\x00evoagent-turn\x00"  # stands for an assistant turn's content in ``continuation``


def load_model(cfg: BackendConfig) -> tuple[Any, Any]:
    """Load (model, tokenizer) named by ``cfg.model``; never touches the network."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = embedded_model_dir() if cfg.model == EMBEDDED_NAME else Path(cfg.model)
    if not (folder / "config.json").is_file():
        raise BackendError(f"policy.model: {folder} is not a Hugging Face model folder")
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=_DTYPES[cfg.dtype], local_files_only=True
    )
    return model, tokenizer


@register_backend("hf", trainable=True)
class HFBackend:
    """Serves ``GenerationRequest``s from a transformers model held in this process."""

    def __init__(self, cfg: BackendConfig, model: Any = None, tokenizer: Any = None) -> None:
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        if model is None or tokenizer is None:
            model, tokenizer = load_model(cfg)
        self.cfg = cfg
        limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        if isinstance(limit, int) and cfg.max_context > limit:
            raise BackendError(
                f"policy.max_context: {cfg.max_context} exceeds the model's context window "
                f"({limit} positions)"
            )
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.eos_ids = _eos_ids(model, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        self.weights_version = 0
        self.cache = GenerationCache()
        self._batcher: Batcher[GenerationRequest, Generation] = Batcher(
            self._generate_batch, cfg.max_batch, cfg.batch_wait_ms
        )
        self.completion_tokens = 0
        self._closing = threading.Event()  # set by aclose: a decode in flight stops at its next step
        # transformers 5.x renamed the KV-cache argument from past_key_values to cache.
        params = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        # Only the last position's logits are sampled from: without this the prefill of a
        # batch of long prompts materialises (B, L, 49k) logits, gigabytes for SmolLM2.
        self._last_logits = {"logits_to_keep": 1} if "logits_to_keep" in params else {}

    # -- Backend -----------------------------------------------------------------------------
    async def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Answer each request, from the cache when allowed, else through the batcher.

        Any failure here is the model's, not the agent's: it is raised as ``BackendError`` so the
        executor does not mistake it for one input's bad luck.
        """
        try:
            return await self._generate(requests)
        except BackendError:
            raise
        except Exception as e:
            raise BackendError(f"hf backend failed: {type(e).__name__}: {e}") from e

    async def _generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        version = self.weights_version
        out: list[Generation | None] = [
            self.cache.get(version, r) if self.cfg.cache else None for r in requests
        ]
        todo = [i for i, g in enumerate(out) if g is None]
        if todo:
            fresh = await self._batcher.submit([requests[i] for i in todo])
            for i, g in zip(todo, fresh, strict=True):
                out[i] = g
                if self.cfg.cache and g.weights_version == version:
                    self.cache.put(version, requests[i], g)
        return [g for g in out if g is not None]

    async def aclose(self) -> None:
        """Stop serving; a batch being decoded in the worker thread ends at its next token, so
        Ctrl-C does not wait for a long generation to finish."""
        self._closing.set()
        await self._batcher.aclose()

    # -- SupportsTraining --------------------------------------------------------------------
    def trainable_model(self) -> Any:
        return self.model

    def set_weights_version(self, version: int) -> None:
        self.weights_version = version

    # -- internals ---------------------------------------------------------------------------
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

    def _with_system(self, messages: Sequence[Message]) -> list[Message]:
        msgs = list(messages)
        if self.cfg.system_prompt and not any(m["role"] == "system" for m in msgs):
            msgs = [{"role": "system", "content": self.cfg.system_prompt}, *msgs]
        return msgs

    def _prompt(self, r: GenerationRequest) -> list[int]:
        """The request's prompt ids, left-truncated to leave room for its token budget (a
        caller that extends a prefix sees the truncation: the prefix is no longer a prefix)."""
        if r.prefix_ids is None:
            ids = self.render(r.messages)
        else:
            after_eos = bool(r.prefix_ids) and r.prefix_ids[-1] in self.eos_ids
            ids = [*r.prefix_ids, *self.continuation(r.messages, after_eos)]
        keep = max(1, self.cfg.max_context - r.max_tokens)
        return ids[-keep:]

    def _generate_batch(self, requests: list[GenerationRequest]) -> list[Generation]:
        """Decode ``requests`` in length-sorted parts of at most ``max_batch_tokens`` each.

        Blocking (the batcher runs it in a worker thread). Sorting puts prompts of similar
        length together, so little of each part is padding; results come back in order.
        """
        prompts = [self._prompt(r) for r in requests]
        cost = [len(p) + r.max_tokens for p, r in zip(prompts, requests, strict=True)]
        out: dict[int, Generation] = {}
        part: list[int] = []

        def flush() -> None:
            gens = self._decode([requests[j] for j in part], [prompts[j] for j in part])
            out.update(zip(part, gens, strict=True))

        for i in sorted(range(len(requests)), key=lambda i: cost[i]):
            if part and (len(part) + 1) * cost[i] > self.cfg.max_batch_tokens:
                flush()
                part = []
            part.append(i)
        flush()
        release_memory()  # the KV caches and prefill activations of this call are garbage now
        return [out[i] for i in range(len(requests))]

    @torch.no_grad()
    def _decode(self, requests: list[GenerationRequest], prompts: list[list[int]]) -> list[Generation]:
        """Decode all requests together (left-padded, one KV cache)."""
        version = self.weights_version
        self.model.eval()
        device = next(self.model.parameters()).device
        b, width = len(prompts), max(len(p) for p in prompts)
        ids = torch.full((b, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((b, width), dtype=torch.long)
        for i, p in enumerate(prompts):  # left padding: every row's next token is at column -1
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        ids, mask = ids.to(device), mask.to(device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        gens = [torch.Generator().manual_seed(r.seed) for r in requests]
        temps = [r.temperature for r in requests]
        budget = max(r.max_tokens for r in requests)
        tokens: list[list[int]] = [[] for _ in requests]
        logps: list[list[float]] = [[] for _ in requests]
        finish = ["length"] * b
        done = [False] * b
        past = None
        step_ids, step_pos = ids, positions
        for _ in range(budget):
            if self._closing.is_set():
                raise BackendError("the backend was closed while generating")
            out = self.model(
                input_ids=step_ids,
                attention_mask=mask,
                position_ids=step_pos,
                use_cache=True,
                **{self._cache_arg: past},
                **self._last_logits,
            )
            past = out.get(self._cache_arg)  # outputs name the cache as forward's argument does
            logits = out.logits[:, -1, :].float().cpu()  # (B, V)
            nxt = torch.full((b,), self.pad_id, dtype=torch.long)
            for i in range(b):
                if done[i]:
                    continue
                t = temps[i]
                lp = torch.log_softmax(logits[i] / (t if t > 0 else 1.0), dim=-1)
                if t > 0:
                    tok = int(torch.multinomial(lp.exp(), 1, generator=gens[i]))
                else:
                    tok = int(lp.argmax())
                tokens[i].append(tok)
                logps[i].append(float(lp[tok]))
                nxt[i] = tok
                if tok in self.eos_ids or self._hit_stop(requests[i], tokens[i]):
                    done[i], finish[i] = True, "stop"
                elif len(tokens[i]) >= requests[i].max_tokens:
                    done[i] = True
            if all(done):
                break
            step_ids = nxt.view(b, 1).to(device)
            step_pos = step_pos[:, -1:] + 1
            mask = torch.cat([mask, torch.ones((b, 1), dtype=mask.dtype, device=device)], dim=1)
        self.completion_tokens += sum(len(t) for t in tokens)
        return [
            Generation(
                text=self._text(r, toks),
                prompt_ids=tuple(p),
                completion_ids=tuple(toks),
                logprobs=tuple(lp),
                finish_reason=f,  # type: ignore[arg-type]
                weights_version=version,
            )
            for r, p, toks, lp, f in zip(requests, prompts, tokens, logps, finish, strict=True)
        ]

    def _hit_stop(self, r: GenerationRequest, toks: list[int]) -> bool:
        if not r.stop:
            return False
        tail = self.tokenizer.decode(toks[-8:], skip_special_tokens=True)
        return any(s in tail for s in r.stop)

    def _text(self, r: GenerationRequest, toks: list[int]) -> str:
        text = self.tokenizer.decode(toks, skip_special_tokens=True)
        for s in r.stop:
            if s in text:
                text = text[: text.index(s)]
        return text.strip()


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(gen_eos, int):
        ids.add(gen_eos)
    elif isinstance(gen_eos, list):
        ids.update(gen_eos)
    if not ids:
        raise BackendError("the tokenizer has no end-of-sequence token")
    return ids
