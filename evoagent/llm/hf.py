"""The in-process transformers backend: the embedded default (SmolLM2-135M-Instruct) or any HF
causal-LM folder, with request batching, a completion cache, prefix KV reuse and weight sync.

Where the time goes, and what this backend does about it:

- **Batching.** Concurrent requests meet in one ``Batcher``; a call is decoded in parts of at
  most ``max_batch_tokens`` (``evoagent.llm.decode``), and finished rows leave the batch.
- **Shared prefixes are prefilled once.** A call's prompts are sorted by their ids, so those
  that share a beginning sit together: the system prompt and demos that every input of an
  agent repeats, the G identical prompts of an RL group. Their common prefixes, level by level
  (a radix tree over the sorted prompts), are prefilled once and kept in a ``PrefixStore``
  (``policy.kv_cache_mb``), where later calls find them too. A ``loop`` turn marked
  ``continued`` leaves its prompt and completion KV there, and the next turn, whose ids extend
  them (token-in/token-out), prefills only the new observation.
- **Trained weights are merged.** RL trains a copy of the model (``trainable_model``);
  ``sync_weights`` merges its LoRA adapter into the generation model in the generation dtype,
  so decoding under a trained adapter costs what decoding the base does. With one adapter per
  node (``rl.adapters: per_node``) each adapter is merged into a generation copy of its own
  and a request naming it (``GenerationRequest.adapter``) is decoded there, in a part of the
  batch with the other requests for that adapter; the base model serves the rest. That costs
  a model's memory per copy, so at most ``policy.max_adapter_copies`` are kept (least recently
  used goes; its memory is reused for the next node's merge, which rewrites only the adapted
  projections), and keeps every token at merged speed: peft's
  mixed-adapter batch (``adapter_names``, LoRA unmerged) decodes at about half the speed
  (bench/backend_throughput.py: lora_unmerged_ratio), and an agent's nodes mostly run one
  after the other, so its requests seldom meet in one batch anyway.
- **The cache** answers a repeated request (same messages, sampling parameters and seed) from
  memory within one set of weights; ``sync_weights`` clears it and the prefix store.

What the RNG cannot fix: bfloat16 matmuls round differently for different batch shapes,
so under ``dtype: bfloat16`` a request may come out a few tokens
different in another batch or from a cached prefix; ``dtype: float32`` is batch-invariant
(tested) and is the choice where exact replay matters.
"""

from __future__ import annotations

import copy
import inspect
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from evoagent.errors import BackendError
from evoagent.heap import release_memory
from evoagent.llm.attention import serve_with_gqa, train_with_sdpa
from evoagent.llm.backend import register_backend
from evoagent.llm.batcher import Batcher
from evoagent.llm.cache import GenerationCache, through_cache
from evoagent.llm.chat import ChatTokens, eos_ids
from evoagent.llm.decode import Sampling, decode, forward
from evoagent.llm.embedded import check_model, model_folder
from evoagent.llm.hardware import DTYPES, resolve_device, resolve_dtype
from evoagent.llm.kv import INDEX, KV, PrefixStore, common_prefix, layout, row_kv
from evoagent.llm.types import Generation, GenerationRequest, Usage
from evoagent.llm.weights import load_served, node_adapters
from evoagent.spec.config import BackendConfig

MIN_EXTRA = 16  # a shared prefix level is prefilled on its own only if it adds this many ids


def load_model(cfg: BackendConfig) -> tuple[Any, Any]:
    """Load (model, tokenizer) named by ``cfg.model``; never touches the network."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = model_folder(cfg.model)
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    device = resolve_device(cfg.device)
    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=DTYPES[resolve_dtype(cfg.dtype, device)], local_files_only=True
    )
    return model.to(device), tokenizer


def model_there(cfg: BackendConfig, field: str) -> None:
    """Preflight: the model ``cfg.model`` names can be loaded (``check_model``)."""
    check_model(cfg.model, f"{field}.model")


@register_backend("hf", trainable=True, preflight=model_there)
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
        serve_with_gqa(model)
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids(model, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos_ids)
        self.chat = ChatTokens(tokenizer, self.eos_ids, cfg.system_prompt, cfg.max_context)
        self.weights_version = 0
        self.cache = GenerationCache()
        self.prefixes = PrefixStore(cfg.kv_cache_mb * 2**20)
        self._batcher: Batcher[GenerationRequest, Generation] = Batcher(
            self._generate_batch, cfg.max_batch, cfg.batch_wait_ms, "hf"
        )
        self._trained: nn.Module | None = None
        self._synced: nn.Module | None = None  # the trained model whose node adapters are served
        self._nodes: list[str] = []  # its node ids (rl.adapters per_node), each served merged
        self._served: OrderedDict[str, tuple[nn.Module, PrefixStore]] = OrderedDict()  # LRU of merged copies
        self._served_lock = threading.Lock()  # the batcher's worker thread and a weight sync both change it
        self.usage = Usage()  # what the model generated (cache hits excluded)
        self.prefilled_tokens = 0  # prompt ids run through the model (cached prefixes excluded)
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

        Any failure of the model call is raised as ``BackendError`` (the batcher wraps it), so the
        executor does not mistake it for one input's bad luck.
        """
        cache = self.cache if self.cfg.cache else None
        return await through_cache(cache, self.weights_version, requests, self._batcher.submit, self.usage)

    async def aclose(self) -> None:
        """Stop serving; a batch being decoded in the worker thread ends at its next token, so
        Ctrl-C does not wait for a long generation to finish."""
        self._closing.set()
        await self._batcher.aclose()

    # -- SupportsTraining --------------------------------------------------------------------
    def trainable_model(self) -> nn.Module:
        """The copy of the policy that RL trains (made on first use; generation keeps its own)."""
        if self._trained is None:
            self._trained = copy.deepcopy(self.model)
            train_with_sdpa(self._trained)
        return self._trained

    def sync_weights(self, model: nn.Module) -> None:
        """Serve ``model``'s weights from now on: its LoRA adapter is merged into the generation
        model in the generation dtype (per node: each node's adapter into a copy of the base,
        merged when the node first asks; the copies held are merged again now). Cached
        completions and prefix KV are dropped."""
        nodes = node_adapters(model)
        if nodes is None:
            try:
                load_served(self.model, model)
            except ValueError as e:
                raise BackendError(f"cannot serve the trained weights: {e}") from e
        else:
            with self._served_lock:
                self._synced, self._nodes = model, nodes
                for node in [n for n in self._served if n not in nodes]:
                    del self._served[node]
                for node, (copied, store) in self._served.items():
                    self._merge(node, copied)
                    store.clear()
                    store.max_bytes = self._kv_share()
        self.cache.clear()
        self.prefixes.clear()
        if nodes:
            self.prefixes.max_bytes = self._kv_share()

    def _kv_share(self) -> int:
        """Each store's part of ``kv_cache_mb``: the base's and every copy's alike."""
        copies = min(len(self._nodes), self.cfg.max_adapter_copies)
        return self.cfg.kv_cache_mb * 2**20 // (1 + copies)

    def _merge(self, node: str, target: nn.Module) -> None:
        try:
            load_served(target, self._synced, node=node)  # type: ignore[arg-type]
        except ValueError as e:
            raise BackendError(f"cannot serve the trained weights of node {node!r}: {e}") from e

    def _served_copy(self, node: str) -> tuple[nn.Module, PrefixStore]:
        """``node``'s merged copy, most recently used now; past ``max_adapter_copies`` the least
        recently used copy is merged over (its memory reused) for ``node``."""
        with self._served_lock:
            if node in self._served:
                self._served.move_to_end(node)
                return self._served[node]
            if len(self._served) >= self.cfg.max_adapter_copies:
                _, (copied, store) = self._served.popitem(last=False)
                store.clear()
            else:
                copied, store = copy.deepcopy(self.model).eval(), PrefixStore(self._kv_share())
            self._merge(node, copied)
            self._served[node] = (copied, store)
            return copied, store

    # -- internals ---------------------------------------------------------------------------
    def _generate_batch(self, requests: list[GenerationRequest]) -> list[Generation]:
        """Decode ``requests`` in parts of at most ``max_batch_tokens`` each.

        Blocking (the batcher runs it in a worker thread). Prompts are sorted by their ids, so
        prompts with a common beginning share a part and their prefix is prefilled once;
        results come back in request order.
        """
        prompts = [self.chat.prompt(r) for r in requests]
        cost = [len(p) + r.max_tokens for p, r in zip(prompts, requests, strict=True)]
        served = [r.adapter if r.adapter in self._nodes else "" for r in requests]
        parts: list[list[int]] = [[]]
        width = 0  # the widest row of the current part
        for i in sorted(range(len(requests)), key=lambda i: (served[i], prompts[i])):
            full = (len(parts[-1]) + 1) * max(width, cost[i]) > self.cfg.max_batch_tokens
            if parts[-1] and (full or served[i] != served[parts[-1][0]]):
                parts.append([])
                width = 0
            parts[-1].append(i)
            width = max(width, cost[i])
        out: dict[int, Generation] = {}
        for part in parts:
            node = served[part[0]]
            model, prefixes = self._served_copy(node) if node else (self.model, self.prefixes)
            out.update(zip(part, self._decode([requests[j] for j in part], [prompts[j] for j in part],
                                              model, prefixes)))
        release_memory()  # the KV caches and prefill activations of this call are garbage now
        return [out[i] for i in range(len(requests))]

    def _decode(self, requests: list[GenerationRequest], prompts: list[list[int]], model: nn.Module,
                prefixes: PrefixStore) -> list[Generation]:
        """Decode one part on ``model`` (the base, or one node's merged copy) with its prefix
        store: reuse or prefill shared prefixes, then decode every row."""
        version = self.weights_version
        model.eval()
        device = next(model.parameters()).device
        if prefixes.max_bytes > 0:
            self._prefill_shared(prompts, device, model, prefixes)
        cached: list[KV | None] = []
        new: list[list[int]] = []
        for p in prompts:
            n, kv = prefixes.longest(p, len(p) - 1) if prefixes.max_bytes else (0, None)
            cached.append(kv)
            new.append(p[n:])
        self.prefilled_tokens += sum(len(x) for x in new)
        budget = max(r.max_tokens for r in requests)
        rows = layout(cached, new, self.pad_id, budget, device)
        keep = prefixes.max_bytes > 0  # a continued loop turn's next turn extends its KV
        decoded = decode(
            model, rows,
            [Sampling(r.temperature, r.max_tokens, r.seed, keep and r.continued) for r in requests],
            self.eos_ids, self.pad_id,
            cache_arg=self._cache_arg, last_logits=self._last_logits,
            closing=self._closing.is_set,
            stopped=lambda row, toks: self.chat.hit_stop(requests[row], toks),
        )
        for p, d in zip(prompts, decoded, strict=True):
            if d.kv is not None:
                prefixes.put(p + d.tokens[:-1], d.kv, once=True)
                d.kv = None
        return [
            Generation(
                text=self.chat.text(r, d.tokens),
                prompt_ids=tuple(p),
                completion_ids=tuple(d.tokens),
                logprobs=tuple(d.logprobs),
                finish_reason=d.finish,  # type: ignore[arg-type]
                weights_version=version,
            )
            for r, p, d in zip(requests, prompts, decoded, strict=True)
        ]

    @torch.inference_mode()
    def _prefill_shared(self, prompts: list[list[int]], device: torch.device, model: nn.Module,
                        prefixes: PrefixStore) -> None:
        """Prefill and store the prefixes that several of ``prompts`` (sorted by ids) share.

        A radix tree over the sorted prompts: a run of prompts whose neighbours share at least
        ``INDEX`` ids has as prefix the least of those shared lengths (capped so every prompt
        keeps one id of its own); the run then splits where neighbours share only that much,
        and each sub-run deepens the prefix. A level is prefilled (on top of the level above,
        from the store) only when it adds ``MIN_EXTRA`` ids; all prefixes of one depth go
        through the model in one batch.
        """
        shared = [
            min(common_prefix(a, b), len(a) - 1, len(b) - 1)
            for a, b in zip(prompts, prompts[1:])
        ]
        levels: list[list[tuple[int, int]]] = []  # depth -> (row, prefix length)

        def walk(lo: int, hi: int, parent: int, depth: int) -> None:  # rows lo..hi share
            if hi - lo < 2:
                return
            n = min(shared[lo : hi - 1])
            if n < INDEX:
                runs = _runs(shared, lo, hi, INDEX)
            else:
                if n - parent >= MIN_EXTRA:
                    while len(levels) <= depth:
                        levels.append([])
                    levels[depth].append((lo, n))
                    parent, depth = n, depth + 1
                runs = _runs(shared, lo, hi, n + 1)
            for a, b in runs:
                walk(a, b, parent, depth)

        walk(0, len(prompts), 0, 0)
        for level in levels:
            todo = []
            for row, n in level:
                have, kv = prefixes.longest(prompts[row], n, consume=False)
                if have < n:
                    todo.append((prompts[row][:n], have, kv))
            if not todo:
                continue
            rows = layout([kv for _, _, kv in todo], [ids[have:] for ids, have, _ in todo],
                          self.pad_id, 0, device)
            self.prefilled_tokens += sum(len(ids) - have for ids, have, _ in todo)
            cache = forward(model, rows, self._cache_arg, self._last_logits).get(self._cache_arg)
            for slot, (ids, _, _) in enumerate(todo):
                cols = rows.attention_mask[slot].nonzero().squeeze(-1)
                prefixes.put(ids, row_kv(cache, slot, cols))


def _runs(shared: list[int], lo: int, hi: int, at_least: int) -> list[tuple[int, int]]:
    """Split rows lo..hi into maximal runs whose neighbours share at least ``at_least`` ids."""
    runs, start = [], lo
    for k in range(lo, hi - 1):
        if shared[k] < at_least:
            runs.append((start, k + 1))
            start = k + 1
    runs.append((start, hi))
    return runs
