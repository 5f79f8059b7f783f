"""RL over a served policy (``kind: openai`` with ``weights``) against vLLM's real server on
127.0.0.1: the preflight refuses a server RL cannot train, a sync loads the trained adapter into
the server (greedy outputs change, nothing older is served, the server's logprobs are the
trainer's), and the adapters are unloaded after."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import torch
from adapters import set_lora_b, trained_lora

from evoagent.errors import BackendError
from evoagent.llm.factory import make_backend
from evoagent.llm.served_lora import ServedPolicy, check_served
from evoagent.llm.types import GenerationRequest
from evoagent.rl.policy import token_logprobs
from evoagent.spec.config import BackendConfig

LOGPROB_TOLERANCE = 1e-4  # the float32 server against the float32 trainer, as for kind: vllm


def config(url: str, weights, **kw) -> BackendConfig:
    return BackendConfig(kind="openai", model="tiny", base_url=url, api_key_env="EVOAGENT_TEST_KEY",
                         weights=str(weights), dtype="float32", max_lora_rank=8, **kw)


def req(text: str, **kw) -> GenerationRequest:
    kw.setdefault("max_tokens", 12)
    return GenerationRequest(({"role": "user", "content": text},), **kw)


def served_names(server) -> list[str]:
    res = httpx.get(f"{server.url}/models", headers={"Authorization": f"Bearer {server.key}"}, timeout=10)
    return [m["id"] for m in res.json()["data"]]


def test_preflight_refuses_a_server_rl_cannot_train(proxy, vllm_model_dir, tmp_path):
    check_served(config(proxy.url, vllm_model_dir), "policy")  # the real server can
    with pytest.raises(BackendError, match=r"policy\.weights: .* is not a Hugging Face model folder"):
        check_served(config(proxy.url, tmp_path), "policy")
    proxy.strip = {"token_ids", "prompt_token_ids"}  # as a server that does not return them
    with pytest.raises(BackendError, match=r"policy\.base_url: RL trains on the token ids .* returned none"):
        check_served(config(proxy.url, vllm_model_dir), "policy")
    proxy.strip, proxy.hide = set(), {"/load_lora_adapter"}  # as a server without runtime LoRA
    with pytest.raises(BackendError, match=r"cannot load LoRA adapters at run time.*--enable-lora "
                                           r"--max-lora-rank 8 with VLLM_ALLOW_RUNTIME_LORA_UPDATING"):
        check_served(config(proxy.url, vllm_model_dir), "policy")


def test_a_sync_serves_the_trained_adapter_from_the_server(openai_server, monkeypatch, vllm_model_dir, tmp_path):
    monkeypatch.setenv("EVOAGENT_TEST_KEY", openai_server.key)
    backend = make_backend(config(openai_server.url, vllm_model_dir, adapter_dir=str(tmp_path / "adapters")))
    assert isinstance(backend, ServedPolicy)
    greedy = req("Calculate 12 + 7.")

    async def go() -> None:
        (before,) = await backend.generate([greedy])
        model = trained_lora(backend, 8, 0.3)
        backend.sync_weights(model)
        backend.weights_version = 1
        (after,) = await backend.generate([greedy])
        assert not after.cached and after.weights_version == 1
        assert after.completion_ids != before.completion_ids
        (sampled,) = await backend.generate([req("hi there", temperature=1.0, seed=9)])
        ids = torch.tensor([sampled.prompt_ids + sampled.completion_ids])
        with torch.no_grad():  # the server's logprobs are the trained copy's
            local = token_logprobs(model.eval(), ids, torch.ones_like(ids), 1.0)[0, len(sampled.prompt_ids):]
        assert (torch.tensor(sampled.logprobs) - local).abs().max() < LOGPROB_TOLERANCE
        first = backend.served_model
        set_lora_b(model, 0)  # a second sync serves the newer adapter, and the older one goes
        backend.sync_weights(model)
        backend.weights_version = 2
        (base_again,) = await backend.generate([greedy])
        assert base_again.completion_ids == before.completion_ids
        names = served_names(openai_server)
        assert backend.served_model in names and first not in names
        assert [p.name for p in (tmp_path / "adapters").iterdir()] == [backend.served_model]
        await backend.aclose()

    asyncio.run(go())
    assert served_names(openai_server) == ["tiny"]  # nothing left loaded on the server


def test_a_continued_turn_trains_on_what_the_server_saw(proxy, vllm_model_dir):
    from evoagent.execute.trajectory import LLMStep
    from evoagent.rl.batch import build_batch

    backend = make_backend(config(proxy.url, vllm_model_dir))
    chat = ({"role": "user", "content": "Calculate 12 + 7."},)

    async def go():
        (first,) = await backend.generate([GenerationRequest(chat, 5, 1.0, 3)])
        turn = (*chat, {"role": "assistant", "content": first.text}, {"role": "user", "content": "Observation: 19"})
        (second,) = await backend.generate(
            [GenerationRequest(turn, 5, 1.0, 4, prefix_ids=first.prompt_ids + first.completion_ids)])
        await backend.aclose()
        return first, second

    first, second = asyncio.run(go())
    assert len(second.prompt_ids) > len(first.prompt_ids)  # the whole chat, as the server rendered it
    steps = [LLMStep("act", (), g.text, g.prompt_ids, g.completion_ids, g.logprobs, 0, "", g.finish_reason)
             for g in (first, second)]
    batch = build_batch(steps, [1.0, 1.0], backend.pad_id, episodes=[0, 0])
    assert int(batch.loss_mask.sum()) == len(first.completion_ids) + len(second.completion_ids)
