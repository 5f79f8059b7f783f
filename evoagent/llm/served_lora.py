"""RL over a served policy (``policy.kind: openai`` with ``weights``).

The server keeps serving; RL trains a LoRA adapter on a local transformers copy of the served
model (``weights``), and each weight sync writes the adapter to ``adapter_dir`` and loads it
into the server under a fresh name through vLLM's runtime LoRA API (``POST
/v1/load_lora_adapter``; the server runs ``vllm serve MODEL --enable-lora --max-lora-rank R``
with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``). Requests then ask for that name as their
model, and the previous adapter is unloaded. A fresh name per sync, never a reload in place:
vLLM's prefix cache would otherwise keep blocks computed under the older adapter.

Training needs the token ids the server sampled and their logprobs (the server's are the
behaviour policy's, for the importance ratio); the preflight asks the server for one token and
refuses RL when they do not come back, and refuses a server without the runtime LoRA
endpoints, before any model loads. The local copy must be the served model: the ids the server
returns are trained on as they are.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

import httpx

from evoagent.errors import BackendError
from evoagent.llm.backend import Backend, register_backend
from evoagent.llm.embedded import check_model, model_folder
from evoagent.llm.openai import EXTRAS, OpenAIBackend, check_server, headers_of, trainable
from evoagent.spec.config import BackendConfig

SERVER_FLAGS = "--enable-lora --max-lora-rank {rank} with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"


def check_served(cfg: BackendConfig, field: str) -> None:
    """Preflight of ``kind: openai``: the server answers and serves ``model``; when RL trains
    it (``weights``), it can also do what training needs (``check_trainable``)."""
    check_server(cfg, field)
    if cfg.weights is not None:
        check_trainable(cfg, field, headers_of(cfg, field))


@register_backend("openai", trainable=True, preflight=check_served, train_check=trainable)
def openai_backend(cfg: BackendConfig) -> Backend:
    """A served policy; with ``weights``, one RL can train (``ServedPolicy``)."""
    return OpenAIBackend(cfg) if cfg.weights is None else ServedPolicy(cfg)


def check_trainable(cfg: BackendConfig, field: str, headers: dict[str, str]) -> None:
    """Preflight of a served policy RL trains: the local copy exists, the server returns the
    sampled token ids and logprobs, and it can load adapters at run time."""
    check_model(str(cfg.weights), f"{field}.weights")
    url = cfg.base_url or ""
    probe = {"model": cfg.model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1,
             "temperature": 0.0, **EXTRAS}
    try:
        res = httpx.post(f"{url}/chat/completions", json=probe, headers=headers, timeout=cfg.timeout_s)
        data = res.json() if res.status_code == 200 else {}
        choice = (data.get("choices") or [{}])[0]
        ids, prompt = choice.get("token_ids"), data.get("prompt_token_ids")
        logprobs = (choice.get("logprobs") or {}).get("content")
    except (httpx.HTTPError, ValueError, AttributeError, TypeError) as e:
        raise BackendError(f"{field}.base_url: {url} did not answer a one-token probe ({type(e).__name__})") from None
    if not (ids and prompt and logprobs):
        raise BackendError(
            f"{field}.base_url: RL trains on the token ids and logprobs the server sampled, and "
            f"{url} returned none (HTTP {res.status_code}); vLLM's server returns them when asked "
            "(return_token_ids)"
        )
    try:  # an empty body: a server with the endpoint refuses it (400/422), one without says 404
        res = httpx.post(f"{url}/load_lora_adapter", json={}, headers=headers, timeout=cfg.timeout_s)
    except httpx.HTTPError as e:
        raise BackendError(f"{field}.base_url: {url}/load_lora_adapter did not answer ({type(e).__name__})") from None
    if res.status_code == 404:
        raise BackendError(
            f"{field}.base_url: {url} cannot load LoRA adapters at run time, which RL needs to "
            f"serve what it trains; start vLLM with {SERVER_FLAGS.format(rank=cfg.max_lora_rank)}"
        )


class ServedPolicy(OpenAIBackend):
    """An OpenAI-compatible served policy that RL trains (``SupportsTraining``)."""

    def __init__(self, cfg: BackendConfig) -> None:
        from transformers import AutoTokenizer

        super().__init__(cfg)
        folder = model_folder(str(cfg.weights), "policy.weights")
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        self.pad_id: int = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.adapters = Path(cfg.adapter_dir or tempfile.mkdtemp(prefix="evoagent-served-lora-"))
        self.adapters.mkdir(parents=True, exist_ok=True)
        self._owns_adapters = cfg.adapter_dir is None
        self._tag = uuid.uuid4().hex[:8]  # names unique to this backend: runs may share a server
        self._syncs = 0
        self._trained: Any = None

    def trainable_model(self) -> Any:
        """The local transformers copy RL trains (loaded on first use)."""
        if self._trained is None:
            from evoagent.llm.hf import load_model

            self._trained, _ = load_model(self.cfg.model_copy(update={"model": self.cfg.weights}))
        return self._trained

    def sync_weights(self, model: Any) -> None:
        """Load ``model``'s adapter into the server under a new name and ask for it from the
        next request on; the previous adapter is unloaded and its folder removed."""
        from peft import PeftModel

        if not isinstance(model, PeftModel):
            raise BackendError("a served policy is trained through LoRA adapters; full fine-tuning cannot reach the server")
        self._syncs += 1
        name = f"evoagent-{self._tag}-v{self._syncs}"
        folder = self.adapters / name
        model.save_pretrained(str(folder))
        self._admin("load_lora_adapter", {"lora_name": name, "lora_path": str(folder.resolve())})
        old, self.served_model = self.served_model, name
        self.cache.clear()
        if old != self.cfg.model:
            self._unload(old)

    async def aclose(self) -> None:
        """Unload the served adapter (the archive's checkpoints keep it) and remove the folder."""
        if self.served_model != self.cfg.model:
            self._unload(self.served_model)
            self.served_model = self.cfg.model
        if self._owns_adapters:
            shutil.rmtree(self.adapters, ignore_errors=True)
        await super().aclose()

    def _unload(self, name: str) -> None:
        """Best effort: a server that is gone has unloaded it already."""
        try:
            self._admin("unload_lora_adapter", {"lora_name": name})
        except BackendError:
            pass
        shutil.rmtree(self.adapters / name, ignore_errors=True)

    def _admin(self, endpoint: str, body: dict[str, str]) -> None:
        url = f"{self.cfg.base_url}/{endpoint}"
        try:
            res = httpx.post(url, json=body, headers=self._headers, timeout=self.cfg.timeout_s)
        except httpx.HTTPError as e:
            raise BackendError(f"{url} did not answer ({type(e).__name__})") from None
        if res.status_code != 200:
            hint = SERVER_FLAGS.format(rank=self.cfg.max_lora_rank)
            raise BackendError(f"{url} answered HTTP {res.status_code}: {res.text[:300]} "
                               f"(the server must run with {hint})")
