"""The RL phase end to end on a tiny model: rollouts → advantages → LoRA step, the backend
samples from the trained weights at once (weight sync), and a checkpoint restores them."""

from __future__ import annotations

import asyncio
from pathlib import Path

from evoagent.execute.executor import ExecContext
from evoagent.graph import load_graph
from evoagent.llm.types import GenerationRequest
from evoagent.rl.config import RLConfig
from evoagent.rl.phase import RLPhase
from evoagent.spec.config import RewardConfig
from evoagent.tasks import Example
from evoagent.tools import ToolContext

ROOT = Path(__file__).resolve().parents[2]
GRAPH = load_graph(ROOT / "graphs" / "direct.yaml")
REQ = GenerationRequest(({"role": "user", "content": "Calculate 12 + 7."},), max_tokens=6,
                        temperature=1.0, seed=5)


def parity(answer: str, example) -> float:
    """Partial credit that varies within a group, so GRPO has a signal."""
    return float(len(answer) % 2)


def phase(backend, tmp_path, **cfg) -> RLPhase:
    cfg = {"dynamic_sampling": False, "steps": 2, **cfg}
    cfg = RLConfig(enabled=True, group_size=4, inputs_per_step=2, lr=5e-2, **cfg)
    ctx = ExecContext(backend, ToolContext(), seed=0)
    # a generous limit: the reward's worker imports this module, slow on a loaded machine
    reward = RewardConfig(kind="python", ref=f"{__name__}:parity", extract="raw", timeout_s=120)
    return RLPhase(cfg, backend, ctx, reward, tmp_path, seed=0)


def logprobs(backend) -> tuple[float, ...]:
    return asyncio.run(fresh_logprobs(backend))


def test_train_updates_the_served_policy_and_checkpoints(tiny_backend, tmp_path):
    backend = tiny_backend(cache=True)
    before = logprobs(backend)
    train = [Example(str(i), f"Calculate {i} + 1.", str(i + 1)) for i in range(4)]
    rl = phase(backend, tmp_path)
    ticks = []
    res = asyncio.run(rl.train([GRAPH], train, generation=2, on_step=lambda: ticks.append(1)))
    path, metrics = res.checkpoint, res.metrics
    assert len(res.rollouts) == 2 * 2 * 4 and not res.archive  # steps x inputs x group; grpo keeps none
    assert metrics["steps_trained"] == 2 and "loss" in metrics and 0 <= metrics["reward_mean"] <= 1
    assert len(ticks) == 2 and [s["step"] for s in metrics["per_step"]] == [0.0, 1.0]  # progress, curves
    assert (tmp_path / path).is_file()
    after = logprobs(backend)
    assert after != before  # the backend already serves the trained LoRA weights

    fresh = tiny_backend(cache=True)
    phase(fresh, tmp_path).restore(path, version=1)
    assert fresh.weights_version == 1
    assert logprobs(fresh) == after


def test_rft_trains_only_on_successes(tiny_backend, tmp_path):
    backend = tiny_backend()
    train = [Example(str(i), f"Calculate {i} + 1.", str(i + 1)) for i in range(4)]
    res = asyncio.run(phase(backend, tmp_path, algorithm="rft").train([GRAPH], train, 1))
    assert res.metrics["steps_trained"] >= 1
    for k, row in enumerate(res.metrics["per_step"]):  # 2 inputs x 4 samples per step
        trajs = res.rollouts[8 * k: 8 * (k + 1)]
        solved = {t.input_id for t in trajs if (t.reward or 0.0) > 0}
        # one row per input that any sample solved (its best sample, rft_top_k 1; direct.yaml
        # is one llm step), none for the failures: GRPO would train on all 8
        assert row.get("rows", 0.0) == len(solved) < len(trajs), (k, row)


def nothing(answer: str, example) -> float:
    return 0.0


def test_a_model_that_scores_nothing_trains_nothing_and_stays_finite(tiny_backend, tmp_path):
    """All-equal rewards give no gradient: every step is skipped (counted), no NaN appears."""
    import torch

    backend = tiny_backend()
    rl = phase(backend, tmp_path, dynamic_sampling=True)
    rl.reward = RewardConfig(kind="python", ref=f"{__name__}:nothing", extract="raw")
    train = [Example(str(i), f"Calculate {i} + 1.", str(i + 1)) for i in range(4)]
    metrics = asyncio.run(rl.train([GRAPH], train, generation=2)).metrics
    assert metrics["steps_trained"] == 0 and metrics["reward_mean"] == 0.0
    assert all(torch.isfinite(p).all() for p in backend.model.parameters())


def test_disk_full_while_writing_a_checkpoint_is_a_clear_error_and_leaves_no_file(
    tiny_backend, tmp_path, monkeypatch
):
    import errno

    import pytest
    import torch

    from evoagent.errors import RLError

    def full(obj, f, *a, **k):
        Path(f).write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    rl = phase(tiny_backend(), tmp_path)
    train = [Example(str(i), f"Calculate {i} + 1.", str(i + 1)) for i in range(4)]
    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(RLError, match=r"No space left on device.*--resume"):
        asyncio.run(rl.train([GRAPH], train, generation=2))
    assert list((tmp_path / "checkpoints").iterdir()) == []


def flaky(answer: str, example) -> float:
    """Raises, returns NaN, returns garbage or scores, by input (rewards may run in several
    worker processes, so nothing here may count calls)."""
    k = int(example.id) % 4
    if k == 0:
        raise ValueError("the grader fell over")
    if k == 1:
        return float("nan")
    return float(len(answer) % 2) if k == 2 else "not a number"  # type: ignore[return-value]


def test_raising_and_nan_rewards_are_skipped_and_counted(tiny_backend, tmp_path):
    import torch

    backend = tiny_backend()
    rl = phase(backend, tmp_path)
    rl.reward = RewardConfig(kind="python", ref=f"{__name__}:flaky", extract="raw")
    train = [Example(str(i), f"Calculate {i} + 1.", str(i + 1)) for i in range(8)]
    res = asyncio.run(rl.train([GRAPH], train, generation=2))
    skipped = sum(s["skipped_reward"] for s in res.metrics["per_step"])
    failing = [t for t in res.rollouts if int(t.input_id) % 4 != 2]
    assert skipped == len(failing) > 0
    assert all(t.skip == "reward" and t.reward == 0.0 and t.error for t in failing)
    assert all(t.skip is None for t in res.rollouts if t not in failing)
    assert all(torch.isfinite(p).all() for p in backend.model.parameters())


def test_dpo_pairs_fresh_rollouts_with_archived_ones(tiny_backend, tmp_path):
    import torch

    backend = tiny_backend()
    asked: list[list[str]] = []

    def history(ids):
        asked.append(list(ids))
        return []

    rl = phase(backend, tmp_path, algorithm="dpo")
    rl.history = history
    train = [Example(str(i), f"Calculate {i} + 1.", str(i + 1)) for i in range(4)]
    before = logprobs(backend)
    metrics = asyncio.run(rl.train([GRAPH], train, generation=1)).metrics
    assert metrics["steps_trained"] >= 1 and metrics["pairs"] >= 1
    assert len(asked) == 2 and all(len(ids) == 2 for ids in asked)  # the archive was asked
    assert logprobs(backend) != before
    assert all(torch.isfinite(p).all() for p in backend.model.parameters())


def odd_inputs_only(answer: str, example) -> float:
    """A signal on odd-numbered inputs only: on the others every sample scores 0."""
    return float(len(answer) % 2) if int(example.id) % 2 else 0.0


def test_oversampling_trains_where_the_samples_disagree(tiny_backend, tmp_path):
    rl = phase(tiny_backend(), tmp_path, oversample=3)
    rl.reward = RewardConfig(kind="python", ref=f"{__name__}:odd_inputs_only", extract="raw")
    trained: list[set[str]] = []
    step = rl._step

    async def spy(trainer, usable, earlier, inputs, group_of, bonus=None):
        trained.append({t.input_id for t in usable})
        return await step(trainer, usable, earlier, inputs, group_of, bonus)

    rl._step = spy
    train = [Example(str(i), f"Calculate {i} + 1.", str(i + 1)) for i in range(12)]
    res = asyncio.run(rl.train([GRAPH], train, generation=1))
    assert len(res.rollouts) == 2 * 6 * 4  # steps x (3 x 2 inputs drawn) x group
    for ids, row in zip(trained, res.metrics["per_step"], strict=True):
        assert ids and all(int(i) % 2 for i in ids) and len(ids) <= 2
        assert row["inputs_with_signal"] >= len(ids)


def test_rft_learns_from_the_archives_successes_when_fresh_samples_all_fail(tiny_backend, tmp_path):
    """An input the current weights no longer solve still teaches what solved it before."""
    backend = tiny_backend()
    train = [Example(str(i), f"Calculate {i} + 1.", str(i + 1)) for i in range(2)]
    first = asyncio.run(phase(backend, tmp_path, algorithm="rft").train([GRAPH], train, 1))
    wins = [t for t in first.rollouts if t.reward == 1.0]
    assert first.archive and wins  # rft keeps its rollouts for later phases

    def later(history):
        rl = phase(backend, tmp_path, algorithm="rft")
        rl.reward = RewardConfig(kind="python", ref=f"{__name__}:nothing", extract="raw")
        rl.history = history
        return asyncio.run(rl.train([GRAPH], train, 2)).metrics["steps_trained"]

    assert later(None) == 0  # every fresh sample fails: nothing to imitate
    assert later(lambda ids: [t for t in first.rollouts if t.input_id in ids]) == 2


def is_two(answer: str, example) -> float:
    return float(answer.strip() == "2")


def test_reserve_agents_give_a_gradient_where_the_elite_all_agree(tiny_backend, tmp_path):
    """rl.spread_agents: the elite (a fixed calculator call) solves every input, so its groups
    carry nothing; a weaker archived agent rolled out on those inputs joins one group per input,
    and its failures now train the policy (negative advantage against the elite's successes)."""
    from evoagent.graph.model import AgentGraph, ToolNode

    always = AgentGraph(name="always", entry="calc", exit="calc",
                        nodes=(ToolNode(id="calc", tool="calculator", template="1 + 1"),))
    train = [Example(str(i), f"Calculate {i} + 1.", "2") for i in range(4)]

    def run(reserve):
        rl = phase(tiny_backend(), tmp_path, dynamic_sampling=True, steps=1)
        rl.reward = RewardConfig(kind="python", ref=f"{__name__}:is_two", extract="raw")
        return asyncio.run(rl.train([always], train, generation=1, reserve=reserve))

    alone = run(())
    assert alone.metrics["steps_trained"] == 0 and alone.metrics["inputs_with_signal"] == 0
    spread = run([GRAPH])
    assert spread.metrics["inputs_spread_by_reserve"] == 2  # both inputs of the step
    assert spread.metrics["steps_trained"] == 1
    assert {t.agent_id for t in spread.rollouts} == {always.id, GRAPH.id}


def test_a_rollback_serves_the_weights_before_the_phase_and_trains_on_from_them(tiny_backend, tmp_path):
    """``rl.rollback``: to the base weights (no path) or to an earlier checkpoint; the next
    phase then trains exactly as a run resumed at that version would."""
    backend = tiny_backend(cache=True)
    base = logprobs(backend)
    train = [Example(str(i), f"Calculate {i} + 1.", str(i + 1)) for i in range(4)]
    rl = phase(backend, tmp_path)
    served: dict[str, tuple[float, ...]] = {}

    async def run() -> None:  # one event loop, as in a run: the reward's worker pool is bound to it
        first = (await rl.train([GRAPH], train, generation=1)).checkpoint
        served["v1"] = await fresh_logprobs(backend)
        await rl.train([GRAPH], train, generation=2)
        served["v2"] = await fresh_logprobs(backend)
        rl.rollback(first, version=1)
        served["back to v1"] = await fresh_logprobs(backend)
        rl.rollback(None, version=0)
        served["back to v0"] = await fresh_logprobs(backend)
        await rl.train([GRAPH], train, generation=3)

    asyncio.run(run())
    assert served["v2"] != served["v1"] == served["back to v1"]
    assert served["back to v0"] == base and backend.weights_version == 0
    fresh = tiny_backend(cache=True)  # a run resumed at v0 starts its trainer afresh
    asyncio.run(phase(fresh, tmp_path / "fresh").train([GRAPH], train, generation=3))
    assert logprobs(fresh) == logprobs(backend)


async def fresh_logprobs(backend) -> tuple[float, ...]:
    backend.cache._data.clear()
    return (await backend.generate([REQ]))[0].logprobs


def test_reusing_the_searchs_episodes_saves_one_steps_rollouts(tiny_backend, tmp_path):
    """``rl.reuse_search``: the first step trains on episodes the search already paid for;
    the phase asks the model for one step's rollouts fewer, and says how many it saved."""
    from evoagent.execute.evaluate import rollout

    train = [Example(str(i), f"Calculate {i} + 1.", str(i + 1)) for i in range(4)]

    def run(reuse: bool) -> tuple[int, object]:
        backend = tiny_backend()
        rl = phase(backend, tmp_path / str(reuse))

        async def go():
            # what the search's screen left: 3 agents' episodes on 2 train inputs (sampled here,
            # so that the input's episodes differ)
            search = await rollout([(GRAPH, ex, k) for ex in train[:2] for k in range(3)], rl.ctx, rl.reward)
            asked = backend.usage.requests
            res = await rl.train([GRAPH], train, generation=1, reused=search if reuse else ())
            return backend.usage.requests - asked, res

        return asyncio.run(go())

    plain_asked, plain = run(False)
    asked, res = run(True)
    assert plain_asked == 2 * 2 * 4 and len(plain.rollouts) == 16  # steps x inputs x group
    assert asked == 1 * 2 * 4 and len(res.rollouts) == 8  # the first step asked for nothing
    first = res.metrics["per_step"][0]
    assert first["reused_samples"] == 6 and first["requests_saved"] == 8
    assert res.metrics["steps_trained"] == 2 and "loss" in first
