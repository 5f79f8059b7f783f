"""The trainer improves what it is told to, accumulates exactly, and resumes bit for bit."""

from __future__ import annotations

import math

import pytest
import torch

from evoagent.errors import RLError
from evoagent.rl.batch import build_batch
from evoagent.rl.config import RLConfig
from evoagent.rl.policy import attach_lora, reference_logprobs, token_logprobs
from evoagent.rl.trainer import Trainer

PAD = 0


def _batch(step):
    steps = [
        step([3, 4, 5], [6, 7, 8]),
        step([3, 4], [9, 10]),
        step([11], [12, 13, 14, 15]),
        step([3, 4, 5, 6], [16]),
    ]
    return build_batch(steps, [1.0, -1.0, 0.5, -0.5], pad_id=PAD)


def _completion_logp(model, batch, row):
    model.eval()
    with torch.no_grad():
        lp = token_logprobs(model, batch.input_ids, batch.attention_mask)
    return float((lp * batch.loss_mask)[row].sum())


def _lora_params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def test_attach_lora_trains_only_the_adapter_and_starts_as_the_base(make_model):
    base = make_model()
    ids = torch.tensor([[1, 2, 3, 4]])
    am = torch.ones_like(ids)
    with torch.no_grad():
        before = token_logprobs(base, ids, am)
    model = attach_lora(base, RLConfig(lora_rank=4, lora_alpha=8))
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert any("gate_proj" in n for n in trainable) and any("q_proj" in n for n in trainable)
    with torch.no_grad():
        torch.testing.assert_close(token_logprobs(model, ids, am), before)
    assert attach_lora(make_model(), RLConfig(full_finetune=True)).__class__.__name__ == (
        "LlamaForCausalLM"
    )


def test_positive_advantage_raises_its_logprob(make_model, step):
    cfg = RLConfig(lr=1e-2, lora_rank=4, lora_alpha=8, tis_cap=None)
    model = attach_lora(make_model(), cfg)
    good = step([3, 4, 5], [6, 7, 8])
    bad = step([3, 4, 5], [20, 21, 22])
    batch = build_batch([good, bad], [1.0, -1.0], pad_id=PAD)
    trainer = Trainer(model, cfg, pad_id=PAD, seed=0)
    before = _completion_logp(model, batch, 0), _completion_logp(model, batch, 1)
    for _ in range(5):
        m = trainer.train_step(batch)
    after = _completion_logp(model, batch, 0), _completion_logp(model, batch, 1)
    assert after[0] > before[0] + 0.1
    assert after[1] < before[1] - 0.1
    assert trainer.step == 5
    assert m["tokens"] == 6.0 and m["rows"] == 2.0
    assert {"loss", "grad_norm", "clip_fraction", "kl", "tis_weight_mean"} <= set(m)


def test_rft_sft_loss_raises_logprob(make_model, step):
    cfg = RLConfig(algorithm="rft", lr=1e-2, lora_rank=4, lora_alpha=8)
    model = attach_lora(make_model(), cfg)
    batch = build_batch([step([3, 4], [30, 31, 32])], [1.0], pad_id=PAD)
    trainer = Trainer(model, cfg, pad_id=PAD, seed=0)
    before = _completion_logp(model, batch, 0)
    for _ in range(3):
        trainer.train_step(batch)
    assert _completion_logp(model, batch, 0) > before + 0.1


@pytest.mark.parametrize("split", [{"grad_accum": 3}, {"micro_batch_tokens": 10}])
def test_micro_batches_match_one_big_batch(make_model, step, split):
    for agg in ("token_mean", "seq_mean_token_mean", "seq_sum_norm"):
        params = []
        for kw in ({}, split):
            cfg = RLConfig(lr=1e-3, lora_rank=4, loss_agg=agg, max_grad_norm=1e9, **kw)
            model = attach_lora(make_model(), cfg)
            trainer = Trainer(model, cfg, pad_id=PAD, seed=0)
            m = trainer.train_step(_batch(step))
            params.append((_lora_params(model), m["loss"], m["grad_norm"]))
        (p1, l1, g1), (p3, l3, g3) = params
        assert l3 == pytest.approx(l1, rel=1e-5, abs=1e-7), agg
        assert g3 == pytest.approx(g1, rel=1e-4), agg
        for n in p1:
            torch.testing.assert_close(p3[n], p1[n], rtol=1e-5, atol=1e-6)


def test_kl_uses_the_base_model_as_reference(make_model, step):
    cfg = RLConfig(lr=1e-2, lora_rank=4, kl_beta=0.1)
    model = attach_lora(make_model(), cfg)
    batch = _batch(step)
    trainer = Trainer(model, cfg, pad_id=PAD, seed=0)
    m0 = trainer.train_step(batch)
    assert m0["kl"] == pytest.approx(0.0, abs=1e-6)  # adapter starts at zero: pi == pi_ref
    for _ in range(3):
        m = trainer.train_step(batch)
    assert m["kl"] > 0
    ref = reference_logprobs(model, batch.input_ids, batch.attention_mask)
    with torch.no_grad():
        base = token_logprobs(make_model(), batch.input_ids, batch.attention_mask)
    torch.testing.assert_close(ref, base)


def test_trainer_rejects_unusable_models_and_batches(make_model, step):
    with pytest.raises(RLError, match="LoRA"):
        Trainer(make_model(), RLConfig(), pad_id=PAD, seed=0)
    model = make_model()
    for p in model.parameters():
        p.requires_grad_(False)
    with pytest.raises(RLError, match="trainable"):
        Trainer(model, RLConfig(full_finetune=True), pad_id=PAD, seed=0)
    cfg = RLConfig(lora_rank=4)
    trainer = Trainer(attach_lora(make_model(), cfg), cfg, pad_id=PAD, seed=0)
    with pytest.raises(RLError, match="no trained tokens"):
        trainer.train_step(build_batch([step([1, 2], [])], [1.0], pad_id=PAD))


@pytest.mark.parametrize("full", [False, True])
def test_checkpoint_resumes_exactly(make_model, step, tmp_path, full):
    """2 steps, a checkpoint, a fresh process state, 1 step == 3 steps straight: weights,
    optimizer moments, the learning-rate schedule and the dropout RNG all come back."""
    cfg = RLConfig(
        lr=1e-2, lora_rank=4, full_finetune=full, lr_schedule="cosine", warmup_steps=1,
        schedule_steps=5,
    )
    batch = _batch(step)
    a = Trainer(attach_lora(make_model(), cfg), cfg, pad_id=PAD, seed=7)
    a.train_step(batch)
    a.train_step(batch)
    a.save_checkpoint(tmp_path / "ckpt" / "trainer.pt")
    a.train_step(batch)
    want = _lora_params(a.model)

    torch.manual_seed(123)  # the process RNG must not matter
    b = Trainer(attach_lora(make_model(), cfg), cfg, pad_id=PAD, seed=999)
    b.load_checkpoint(tmp_path / "ckpt" / "trainer.pt")
    assert b.step == 2
    b.train_step(batch)
    assert b.step == 3
    assert b.scheduler.get_last_lr() == a.scheduler.get_last_lr() != [cfg.lr]
    got = _lora_params(b.model)
    assert got.keys() == want.keys()
    for n in want:
        torch.testing.assert_close(got[n], want[n], rtol=0, atol=1e-6)
    assert not list((tmp_path / "ckpt").glob("*.tmp"))


def test_a_checkpoint_from_before_schedules_still_resumes(make_model, step, tmp_path):
    cfg = RLConfig(lr=1e-2, lora_rank=4)
    a = Trainer(attach_lora(make_model(), cfg), cfg, pad_id=PAD, seed=0)
    a.train_step(_batch(step))
    a.save_checkpoint(tmp_path / "new.pt")
    state = torch.load(tmp_path / "new.pt", weights_only=True)
    del state["scheduler"]
    state["format"] = 1
    torch.save(state, tmp_path / "old.pt")
    b = Trainer(attach_lora(make_model(), cfg), cfg, pad_id=PAD, seed=0)
    b.load_checkpoint(tmp_path / "old.pt")
    assert b.step == 1 and b.scheduler.get_last_lr() == [cfg.lr]
    b.train_step(_batch(step))


def test_load_checkpoint_rejects_garbage(make_model, tmp_path):
    cfg = RLConfig(lora_rank=4)
    trainer = Trainer(attach_lora(make_model(), cfg), cfg, pad_id=PAD, seed=0)
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(RLError):
        trainer.load_checkpoint(bad)
    torch.save({"format": 99}, tmp_path / "old.pt")
    with pytest.raises(RLError, match="format"):
        trainer.load_checkpoint(tmp_path / "old.pt")


def test_dpo_raises_the_chosen_side_and_accumulates_exactly(make_model, step):
    # episodes 0 and 1 are one pair; episode 0 spans two rows (two nodes of one agent)
    steps = [step([3, 4, 5], [6, 7, 8]), step([3, 9], [10]), step([3, 4, 5], [11, 12])]
    batch = build_batch(steps, [0.0] * 3, pad_id=PAD, episodes=[0, 0, 1])
    chosen, rejected = torch.tensor([0]), torch.tensor([1])
    results = []
    for kw in ({}, {"micro_batch_tokens": 4}):
        cfg = RLConfig(algorithm="dpo", lr=1e-2, lora_rank=4, max_grad_norm=1e9, **kw)
        model = attach_lora(make_model(), cfg)
        trainer = Trainer(model, cfg, pad_id=PAD, seed=0)
        m0 = trainer.train_pairs(batch, chosen, rejected)
        assert m0["loss"] == pytest.approx(math.log(2.0), abs=1e-6)  # adapter at 0: pi == ref
        for _ in range(5):
            m = trainer.train_pairs(batch, chosen, rejected)
        results.append((_lora_params(model), m0["grad_norm"]))
        assert m["reward_margin"] > 0 and m["pair_accuracy"] == 1.0
    (p1, g1), (p2, g2) = results
    assert g2 == pytest.approx(g1, rel=1e-4)
    for n in p1:
        torch.testing.assert_close(p2[n], p1[n], rtol=1e-4, atol=1e-6)
