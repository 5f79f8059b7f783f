"""``rl.adapters: per_node`` on the hf backend keeps at most ``policy.max_adapter_copies``
merged copies of the model: a run whose agents bring more node ids than that serves each node
its own adapter all the same (the least recently used copy is merged over), and its memory
stays flat."""

from __future__ import annotations

import asyncio
import gc

import torch
from adapters import node_loras

from evoagent.llm.hf import HFBackend
from evoagent.llm.types import GenerationRequest
from evoagent.spec.config import BackendConfig

NODES = [f"step{i}" for i in range(6)]


def _req(node: str) -> GenerationRequest:
    return GenerationRequest(({"role": "user", "content": "Calculate 12 + 7."},), max_tokens=6, adapter=node)


def _serve(backend: HFBackend, nodes: list[str]) -> dict[str, tuple[int, ...]]:
    backend.cache.clear()
    return {n: asyncio.run(backend.generate([_req(n)]))[0].completion_ids for n in nodes}


def test_more_nodes_than_copies_are_each_served_their_own_adapter(tiny_backend):
    capped, free = tiny_backend(max_adapter_copies=2), tiny_backend(max_adapter_copies=len(NODES))
    for b in (capped, free):
        b.sync_weights(node_loras(b.trainable_model(), NODES, 4, 0.5))
    want = _serve(free, NODES)
    assert len(set(want.values())) > 1  # the adapters differ
    assert _serve(capped, NODES) == want
    assert list(capped._served) == NODES[-2:]  # the two most recently used
    assert _serve(capped, NODES[:3]) == {n: want[n] for n in NODES[:3]}  # evicted, merged again
    capped.sync_weights(capped._synced)  # a new version: the copies held are merged again
    assert list(capped._served) == NODES[1:3] and _serve(capped, NODES) == want


def _tensor_mb() -> float:
    """MB held by every live tensor of this process, each storage counted once. Unlike RSS,
    which the allocator keeps flat by reusing memory earlier tests freed, this sees a copy
    the moment it is made, and a copy still referenced anywhere (a leak) stays counted."""
    gc.collect()
    storages: dict[int, int] = {}
    for obj in gc.get_objects():  # plain tensors only: a subclass (a FakeTensor that vLLM's
        # compiler left behind, say) may hold no memory and refuse its data pointer
        if type(obj) in (torch.Tensor, torch.nn.Parameter) and obj.layout == torch.strided \
                and obj.device.type != "meta":
            storage = obj.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values()) / 2**20


def test_memory_stays_flat_however_many_nodes_a_run_adds(tiny_tokenizer):
    """A model of about 50 MB: a copy per node would add that much for every new node."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(2)
    torch.manual_seed(0)
    big = LlamaForCausalLM(LlamaConfig(vocab_size=len(tiny_tokenizer), hidden_size=512, intermediate_size=1536,
                                       num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2))
    copy_mb = sum(p.numel() * p.element_size() for p in big.parameters()) / 2**20
    backend = HFBackend(BackendConfig(dtype="float32", max_adapter_copies=2), model=big.eval(),
                        tokenizer=tiny_tokenizer)
    backend.sync_weights(node_loras(backend.trainable_model(), NODES, 4, 0.1))
    before = _tensor_mb()
    _serve(backend, NODES[:2])
    after_two = _tensor_mb()
    assert after_two - before > 1.5 * copy_mb  # two copies made: the measure sees copies
    for _ in range(3):
        _serve(backend, NODES)
    grown = _tensor_mb() - after_two
    assert len(backend._served) == 2
    assert grown < 0.5 * copy_mb, f"tensors grew {grown:.0f} MB past two copies of {copy_mb:.0f} MB"
