"""``kind: openai``: any OpenAI-compatible chat server (``vllm serve``, llama.cpp's server, a
hosted API) by ``base_url`` and ``model``, for the policy or the mutator.

Each request is one ``POST {base_url}/chat/completions``. At most ``max_in_flight`` are in
flight at once; each has ``timeout_s``; a 429, a 5xx, a dropped connection or a timeout is
retried ``retries`` times with exponential backoff and jitter (honouring ``Retry-After``),
then the request fails as a ``BackendError`` (the server is gone: the loop archives the
candidate as crashed). Any other 4xx is this request's own fault (a prompt longer than the
server's context window) and fails as ``RequestRejected``, which the executor records on that
input's trajectory.

Logprobs and token ids come back where the server gives them: ``logprobs: true`` is asked
for, and ``return_token_ids: true`` (vLLM's extension; a server that refuses either is asked
again without it, once, and remembered). Token-in (``prefix_ids``) is not possible over a chat
API: the server renders the whole chat, so a continued turn's prompt ids are the server's
rendering, which need not extend the previous turn's ids (training then gives the turn a row
of its own instead of joining the episode's).

With ``weights`` set the policy is trained by RL: see ``evoagent.llm.served_lora`` (a local
copy is trained, each adapter is loaded into the server and requests name it), which also
registers the ``openai`` backend.

The API key is read from the environment variable named by ``api_key_env`` when the backend
is built and kept only in the client's headers: it is never in the spec, the archive, the
report or a log line, and error messages never quote headers.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Sequence
from typing import Any

import httpx

from evoagent.errors import BackendError
from evoagent.llm.backend import TrainingNeeds, lora_fits
from evoagent.llm.cache import GenerationCache, through_cache
from evoagent.llm.types import Generation, GenerationRequest, Usage
from evoagent.spec.config import BackendConfig

RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}
EXTRAS = {"logprobs": True, "return_token_ids": True}  # asked for; dropped if the server refuses


class RequestRejected(Exception):
    """The server refused this one request (4xx): a per-input failure, not the backend's."""


def api_key(cfg: BackendConfig, field: str = "") -> str | None:
    """The key from the environment variable ``cfg.api_key_env`` names (None: no auth)."""
    if cfg.api_key_env is None:
        return None
    key = os.environ.get(cfg.api_key_env)
    if not key:
        where = f"{field}.api_key_env" if field else "api_key_env"
        raise BackendError(f"{where}: the environment variable {cfg.api_key_env} is not set")
    return key


def check_server(cfg: BackendConfig, field: str) -> None:
    """Before the search: the server answers at ``base_url`` and serves ``model``."""
    headers = headers_of(cfg, field)
    url = f"{cfg.base_url}/models"
    try:
        res = httpx.get(url, headers=headers, timeout=min(cfg.timeout_s, 10.0))
    except httpx.HTTPError as e:
        raise BackendError(f"{field}.base_url: no answer from {url} ({type(e).__name__})") from None
    if res.status_code in (401, 403):
        raise BackendError(f"{field}.api_key_env: {url} refused the key (HTTP {res.status_code})")
    if res.status_code != 200:
        raise BackendError(f"{field}.base_url: {url} answered HTTP {res.status_code}")
    try:
        served = [m["id"] for m in res.json()["data"]]
    except (ValueError, KeyError, TypeError):
        raise BackendError(f"{field}.base_url: {url} is not an OpenAI-compatible model list") from None
    if cfg.model not in served:
        raise BackendError(f"{field}.model: {cfg.model!r} is not served at {cfg.base_url}; it serves {served}")


def trainable(policy: BackendConfig, rl: TrainingNeeds) -> str | None:
    """Train check: RL over a served policy trains a LoRA adapter on a local copy."""
    if policy.weights is None:
        return ("policy.weights: RL over an openai policy trains a LoRA adapter on a local copy of "
                "the served model and loads it into the server; name that copy ('embedded' or an "
                "HF folder)")
    if rl.full_finetune:
        return ("rl.full_finetune: an openai policy is trained through LoRA adapters loaded into "
                "its server; full fine-tuning cannot reach the server")
    if rl.per_node:
        return ("rl.adapters: per_node serves each node its own adapter, which policy.kind hf and "
                "vllm do; an openai policy serves one adapter to every node (use adapters: shared)")
    return lora_fits(policy, rl)


class OpenAIBackend:
    """Serves ``GenerationRequest``s from an OpenAI-compatible chat server."""

    def __init__(self, cfg: BackendConfig) -> None:
        if cfg.base_url is None:
            raise BackendError("base_url: required for kind openai")
        self.cfg = cfg
        self._headers = headers_of(cfg)
        self.weights_version = 0
        self.cache = GenerationCache()
        self.extras = dict(EXTRAS)
        self.retried = 0
        self.usage = Usage()  # what the model generated (cache hits excluded)
        self.served_model = cfg.model  # the name requests ask for (a trained adapter's, once synced)
        self._client: httpx.AsyncClient | None = None
        self._gate: asyncio.Semaphore | None = None

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Answer each request (concurrently, at most ``max_in_flight`` at once)."""
        cache = self.cache if self.cfg.cache else None
        return await through_cache(cache, self.weights_version, requests, self._fetch, self.usage)

    async def _fetch(self, requests: list[GenerationRequest]) -> list[Generation]:
        return list(await asyncio.gather(*(self._one(r) for r in requests)))

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _one(self, r: GenerationRequest) -> Generation:
        messages = list(r.messages)
        if self.cfg.system_prompt and not any(m["role"] == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": self.cfg.system_prompt})
        body: dict[str, Any] = {
            "model": self.served_model, "messages": messages, "max_tokens": r.max_tokens,
            "temperature": r.temperature, "seed": r.seed % 2**31,
        }
        if r.stop:
            body["stop"] = list(r.stop)
        data = await self._post(body)
        try:
            choice = data["choices"][0]
            text = choice["message"]["content"] or ""
            finish = "length" if choice.get("finish_reason") == "length" else "stop"
            ids = tuple(choice.get("token_ids") or ())
            content = (choice.get("logprobs") or {}).get("content") or []
            logprobs = tuple(float(t["logprob"]) for t in content)
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise BackendError(f"{self.cfg.base_url} answered a malformed completion: {e!r}") from None
        prompt = tuple(data.get("prompt_token_ids") or ())
        if len(logprobs) != len(ids):
            ids, logprobs = (), ()  # only a matching pair is usable for training
        return Generation(text=text.strip(), prompt_ids=prompt, completion_ids=ids, logprobs=logprobs,
                          finish_reason=finish, weights_version=self.weights_version)  # type: ignore[arg-type]

    async def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST with the extras the server accepts, retries and the in-flight cap."""
        if self._client is None:
            self._client = httpx.AsyncClient(base_url=self.cfg.base_url or "", headers=self._headers,
                                             timeout=self.cfg.timeout_s)
            self._gate = asyncio.Semaphore(self.cfg.max_in_flight)
        assert self._gate is not None
        last = ""
        for attempt in range(self.cfg.retries + 1):
            extras = dict(self.extras)
            async with self._gate:
                try:
                    res = await self._client.post("/chat/completions", json={**body, **extras})
                except httpx.HTTPError as e:  # refused, dropped, timed out: the server may come back
                    res, last = None, f"{type(e).__name__}"
            if res is not None and res.status_code == 200:
                return res.json()
            if res is not None and res.status_code not in RETRY_STATUS:
                if res.status_code == 400 and extras and _refuses_extras(res.text, extras):
                    for key in extras:
                        self.extras.pop(key, None)
                    continue
                if res.status_code in (401, 403):
                    raise BackendError(f"{self.cfg.base_url} refused the API key (HTTP {res.status_code})")
                raise RequestRejected(f"{self.cfg.base_url} rejected the request: HTTP "
                                      f"{res.status_code}: {res.text[:300]}")
            if res is not None:
                last = f"HTTP {res.status_code}"
            if attempt < self.cfg.retries:
                self.retried += 1
                await asyncio.sleep(_backoff(attempt, res))
        raise BackendError(f"{self.cfg.base_url} failed {self.cfg.retries + 1} times (last: {last})")


def headers_of(cfg: BackendConfig, field: str = "") -> dict[str, str]:
    """The request headers: the bearer key from ``api_key_env``, if any."""
    key = api_key(cfg, field)
    return {"Authorization": f"Bearer {key}"} if key else {}


def _refuses_extras(text: str, extras: dict[str, Any]) -> bool:
    """Whether a 400's message names one of the optional fields we added."""
    return any(k in text for k in extras)


def _backoff(attempt: int, res: httpx.Response | None) -> float:
    """Seconds before retry ``attempt + 1``: the server's ``Retry-After``, else 0.5 x 2^attempt
    with jitter, at most 30."""
    if res is not None:
        try:
            return min(30.0, float(res.headers.get("retry-after", "")))
        except ValueError:
            pass
    return min(30.0, 0.5 * 2**attempt) * (0.5 + random.random() / 2)
