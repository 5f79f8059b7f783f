"""``kind: openai`` against vLLM's real OpenAI-compatible server on 127.0.0.1: token ids and
logprobs, the API key, and what a flaky or dead server does (through a small proxy that
answers 429/503, drops connections or goes down before passing requests on)."""

from __future__ import annotations

import asyncio

import pytest

from evoagent.errors import BackendError
from evoagent.llm.openai import OpenAIBackend, RequestRejected, check_server
from evoagent.llm.types import GenerationRequest
from evoagent.spec.config import BackendConfig


def config(url: str, **kw) -> BackendConfig:
    return BackendConfig(kind="openai", model="tiny", base_url=url, api_key_env="EVOAGENT_TEST_KEY",
                         cache=False, **kw)


def req(text: str, **kw) -> GenerationRequest:
    kw.setdefault("max_tokens", 8)
    return GenerationRequest(({"role": "user", "content": text},), **kw)


def run(backend: OpenAIBackend, requests: list[GenerationRequest]):
    async def go():
        try:
            return await backend.generate(requests)
        finally:
            await backend.aclose()

    return asyncio.run(go())


def test_preflight_names_what_is_wrong(proxy, monkeypatch):
    check_server(config(proxy.url), "mutator")
    with pytest.raises(BackendError, match=r"mutator\.model: 'gpt-9' is not served at .*; it serves \['tiny'\]"):
        check_server(config(proxy.url).model_copy(update={"model": "gpt-9"}), "mutator")
    monkeypatch.setenv("EVOAGENT_TEST_KEY", "sk-wrong")
    with pytest.raises(BackendError, match=r"mutator\.api_key_env: .* refused the key \(HTTP 401\)"):
        check_server(config(proxy.url), "mutator")
    monkeypatch.delenv("EVOAGENT_TEST_KEY")
    with pytest.raises(BackendError, match=r"policy\.api_key_env: the environment variable EVOAGENT_TEST_KEY is not set"):
        check_server(config(proxy.url), "policy")


def test_completions_carry_token_ids_and_logprobs(proxy, vllm_model_dir):
    from transformers import AutoTokenizer

    from evoagent.llm.chat import ChatTokens

    requests = [req("Calculate 12 + 7."), req("hi", temperature=1.0, seed=3), req("hi", temperature=1.0, seed=3)]
    gens = run(OpenAIBackend(config(proxy.url)), requests)
    chat = ChatTokens(AutoTokenizer.from_pretrained(vllm_model_dir), set(), "", 512)
    for r, g in zip(requests, gens, strict=True):
        assert len(g.completion_ids) == len(g.logprobs) > 0 and all(lp <= 0 for lp in g.logprobs)
        assert list(g.prompt_ids) == chat.render(r.messages)  # the server's own tokens
    assert gens[1].completion_ids == gens[2].completion_ids  # the seed reaches the server


def test_429_5xx_and_dropped_connections_are_retried(proxy):
    (expected,) = run(OpenAIBackend(config(proxy.url)), [req("Calculate 12 + 7.")])
    proxy.plan = ["429", "503", "drop"]
    backend = OpenAIBackend(config(proxy.url, retries=3))
    (got,) = run(backend, [req("Calculate 12 + 7.")])
    assert got.completion_ids == expected.completion_ids
    assert backend.retried == 3 and proxy.posts == 5


def test_a_server_that_stays_down_is_a_backend_error_and_a_bad_request_is_the_requests(proxy):
    proxy.down = True
    backend = OpenAIBackend(config(proxy.url, retries=2))
    with pytest.raises(BackendError, match=r"failed 3 times \(last: .*Error\)"):
        run(backend, [req("hi")])
    proxy.down = False
    with pytest.raises(RequestRejected, match=r"HTTP 400"):  # longer than the server's 512 positions
        run(OpenAIBackend(config(proxy.url)), [req("hi " * 600, max_tokens=8)])
