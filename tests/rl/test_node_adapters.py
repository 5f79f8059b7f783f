"""``rl.adapters: per_node``: each llm node trains and is served its own LoRA adapter, from the
trainer's step to the backend's batch, the checkpoint, the export and the replay."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from adapters import node_loras

from evoagent.errors import RLError
from evoagent.execute.executor import ExecContext
from evoagent.graph import load_graph
from evoagent.llm.factory import make_backend
from evoagent.llm.types import GenerationRequest
from evoagent.llm.weights import NODE_PREFIX, adapter_name, node_adapters
from evoagent.replay import ArchivedAgent, export, run_exported, run_once
from evoagent.rl.batch import build_batch
from evoagent.rl.config import RLConfig
from evoagent.rl.phase import RLPhase
from evoagent.rl.policy import attach_lora, by_node, token_logprobs
from evoagent.rl.trainer import Trainer
from evoagent.spec.config import BackendConfig, RewardConfig
from evoagent.tasks import Example
from evoagent.tools import SandboxConfig, ToolContext

ROOT = Path(__file__).resolve().parents[2]
PAD = 0
CFG = RLConfig(enabled=True, lr=1e-2, lora_rank=4, lora_alpha=8, tis_cap=None, adapters="per_node")


def _adapter_params(model) -> dict[str, dict[str, torch.Tensor]]:
    """node -> its LoRA parameters (copies)."""
    out: dict[str, dict[str, torch.Tensor]] = {}
    for name, p in model.named_parameters():
        if "lora_" in name:
            out.setdefault(name.split(".")[-2].removeprefix(NODE_PREFIX), {})[name] = p.detach().clone()
    return out


def _changed(before, after) -> set[str]:
    return {node for node, ps in after.items()
            if node not in before or any(not torch.equal(p, before[node][n]) for n, p in ps.items())}


def test_each_node_trains_its_own_adapter_on_its_own_tokens(make_model, step):
    model = attach_lora(make_model(), CFG)
    assert node_adapters(model) == []  # no node has met the trainer yet
    trainer = Trainer(model, CFG, pad_id=PAD, seed=0)
    plan = [step([3, 4, 5], [6, 7, 8], node="plan"), step([3, 4, 5], [20, 21], node="plan")]
    solve = step([3, 4], [9, 10], node="solve")
    trainer.train_step(build_batch([plan[0], solve, plan[1]], [1.0, 1.0, -1.0], pad_id=PAD))
    assert node_adapters(model) == ["plan", "solve"]
    before = _adapter_params(model)
    model.set_adapter(adapter_name("plan"))
    batch = build_batch(plan, [1.0, -1.0], pad_id=PAD)
    model.eval()
    with torch.no_grad():
        old = token_logprobs(model, batch.input_ids, batch.attention_mask)
    for _ in range(3):
        trainer.train_step(batch)  # plan's tokens only
    assert _changed(before, _adapter_params(model)) == {"plan"}  # solve's adapter and the base untouched
    model.set_adapter(adapter_name("plan"))
    model.eval()
    with torch.no_grad():
        new = token_logprobs(model, batch.input_ids, batch.attention_mask)
    gain = ((new - old) * batch.loss_mask).sum(dim=1)
    assert gain[0] > 0.1 and gain[1] < -0.1  # the good plan up, the bad one down


def test_a_per_node_checkpoint_resumes_bit_for_bit(make_model, step, tmp_path):
    # node ids that are also peft's and transformers' names ("model" is a module, "default"
    # peft's first adapter) stay apart from them
    batch = build_batch([step([3, 4, 5], [6, 7], node="model"), step([3, 4], [9, 10], node="default")],
                        [1.0, -1.0], pad_id=PAD)
    first = Trainer(attach_lora(make_model(), CFG), CFG, pad_id=PAD, seed=0)
    first.train_step(batch)
    first.save_checkpoint(tmp_path / "c.pt")
    assert set(by_node(first.weights())) == {"model", "default"}
    assert all(len(w) == 2 * 7 * 2 for w in by_node(first.weights()).values())  # A and B, 7 projections, 2 layers
    resumed = Trainer(attach_lora(make_model(), CFG), CFG, pad_id=PAD, seed=0)
    resumed.load_checkpoint(tmp_path / "c.pt")
    for t in (first, resumed):
        t.train_step(batch)
    a, b = first.weights(), resumed.weights()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_a_batch_that_does_not_name_its_nodes_is_refused(make_model, step):
    batch = build_batch([step([3, 4], [5, 6])], [1.0], pad_id=PAD)
    trainer = Trainer(attach_lora(make_model(), CFG), CFG, pad_id=PAD, seed=0)
    with pytest.raises(RLError, match="which node"):
        trainer.train_step(type(batch)(**{**batch.__dict__, "node": ()}))


def _req(text: str, adapter: str | None) -> GenerationRequest:
    return GenerationRequest(({"role": "user", "content": text},), max_tokens=6, adapter=adapter)


def test_the_backend_serves_each_node_its_adapter_in_one_batch(tiny_backend):
    backend = tiny_backend()
    ask = [_req("Calculate 12 + 7.", a) for a in (None, "plan", "solve", "unknown")]
    base = asyncio.run(backend.generate(ask))
    assert len({g.completion_ids for g in base}) == 1  # nothing trained yet: every node gets the base
    model = node_loras(backend.trainable_model(), ["plan", "solve"], 4, 0.5)
    backend.sync_weights(model)
    out = asyncio.run(backend.generate(ask))  # one call, three sets of weights
    assert out[0].completion_ids == base[0].completion_ids  # no adapter: the base, unchanged
    assert out[3].completion_ids == base[3].completion_ids  # a node no phase trained: the base
    assert out[1].completion_ids != out[2].completion_ids
    for g, node in zip(out[1:3], ("plan", "solve"), strict=True):
        model.set_adapter(adapter_name(node))
        ids = torch.tensor([g.prompt_ids + g.completion_ids])
        with torch.no_grad():
            want = token_logprobs(model.eval(), ids, torch.ones_like(ids))[0, len(g.prompt_ids):]
        assert torch.allclose(torch.tensor(g.logprobs), want, atol=1e-4), node


def parity(answer: str, example) -> float:
    """Partial credit that varies within a group, so GRPO has a signal at every node."""
    return float(len(answer) % 2)


def test_a_phase_trains_every_node_of_the_agent_and_the_export_replays_them(tiny_model_dir, tmp_path):
    graph = load_graph(ROOT / "graphs" / "critique_revise.yaml")
    policy = BackendConfig(kind="hf", model=str(tiny_model_dir), dtype="float32")
    cfg = CFG.model_copy(update={"steps": 1, "group_size": 4, "inputs_per_step": 2, "lr": 5e-2,
                                 "dynamic_sampling": False, "max_completion_tokens": 16})
    backend = make_backend(policy)
    # a generous limit: the reward's worker imports this module, slow on a loaded machine
    reward = RewardConfig(kind="python", ref=f"{__name__}:parity", extract="raw", timeout_s=120)
    rl = RLPhase(cfg, backend, ExecContext(backend, ToolContext(), seed=0), reward, tmp_path, seed=0)
    train = [Example(str(i), f"Calculate {i} + 1.", str(i + 1)) for i in range(2)]
    res = asyncio.run(rl.train([graph], train, generation=1))
    asyncio.run(backend.aclose())
    assert res.metrics["steps_trained"] == 1, [t.error for t in res.rollouts[:2]]
    assert set(by_node(rl.weights())) == {"draft", "critique", "revise"}

    agent = ArchivedAgent("a1", graph, policy, SandboxConfig(), 0, cfg, 1, tmp_path / res.checkpoint)
    replayed = asyncio.run(run_once(agent, "Calculate 3 + 4."))
    out = tmp_path / "export"
    export(agent, out)
    assert {p.name for p in (out / "adapter").iterdir()} == {"draft", "critique", "revise"}
    assert (out / "adapter" / "draft" / "adapter_config.json").is_file()  # peft's own format
    exported = asyncio.run(run_exported(out, "Calculate 3 + 4."))
    assert [s.text for s in exported.llm_steps] == [s.text for s in replayed.llm_steps]
    untrained = asyncio.run(run_once(ArchivedAgent("a0", graph, policy, SandboxConfig(), 0, cfg, 0),
                                     "Calculate 3 + 4."))
    assert [s.text for s in untrained.llm_steps] != [s.text for s in replayed.llm_steps]


def test_a_rolled_back_phase_deletes_the_adapters_it_created_and_training_goes_on(tiny_model_dir, tmp_path):
    """``rl.rollback`` to the base weights: the nodes the phase gave adapters are served the
    base weights again, and the next phase creates and trains them afresh."""
    graph = load_graph(ROOT / "graphs" / "critique_revise.yaml")
    backend = make_backend(BackendConfig(kind="hf", model=str(tiny_model_dir), dtype="float32"))
    cfg = CFG.model_copy(update={"steps": 1, "group_size": 4, "inputs_per_step": 2, "lr": 5e-2,
                                 "dynamic_sampling": False, "max_completion_tokens": 16})
    reward = RewardConfig(kind="python", ref=f"{__name__}:parity", extract="raw", timeout_s=120)
    rl = RLPhase(cfg, backend, ExecContext(backend, ToolContext(), seed=0), reward, tmp_path, seed=0)
    train = [Example(str(i), f"Calculate {i} + 1.", str(i + 1)) for i in range(2)]

    async def run() -> tuple[set[str], set[str], float]:
        await rl.train([graph], train, generation=1)
        trained = set(by_node(rl.weights()))
        rl.rollback(None, version=0)
        after = set(by_node(rl.weights()))
        again = await rl.train([graph], train, generation=2)
        return trained, after, again.metrics["steps_trained"]

    trained, after, steps = asyncio.run(run())
    asyncio.run(backend.aclose())
    assert trained == {"draft", "critique", "revise"} and after == set() and steps == 1
    assert set(by_node(rl.weights())) == trained
