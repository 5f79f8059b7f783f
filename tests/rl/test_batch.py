"""Token batches keep the sampled ids exactly; advantages per step; RL config validation."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from evoagent.errors import RLError
from evoagent.execute.trajectory import ToolStep
from evoagent.rl.advantages import known_advantages
from evoagent.rl.batch import build_batch, episode_advantages
from evoagent.rl.config import RLConfig
from evoagent.rl.losses import LossInputs, get_policy_loss
from evoagent.rl.policy import token_logprobs

PAD = 0


def _group(t):
    return (t.agent_id, t.input_id)


# ------------------------------------------------------------------ build_batch


def test_build_batch_keeps_ids_and_masks_only_completions(step):
    a = step([5, 6, 7], [8, 9], logprobs=[-0.5, -0.25])
    b = step([5], [10, 11, 12, 13], logprobs=[-1.0, -2.0, -3.0, -4.0])
    batch = build_batch([a, b], [1.5, -0.5], pad_id=PAD)
    assert batch.rows == 2
    assert batch.input_ids.tolist() == [[5, 6, 7, 8, 9], [5, 10, 11, 12, 13]]
    assert batch.input_ids.dtype == torch.long
    assert batch.attention_mask.tolist() == [[1] * 5, [1] * 5]
    assert batch.loss_mask.tolist() == [[0, 0, 0, 1, 1], [0, 1, 1, 1, 1]]
    # old_logp sits at the target token's own position
    assert batch.old_logp.tolist() == [[0, 0, 0, -0.5, -0.25], [0, -1.0, -2.0, -3.0, -4.0]]
    assert batch.advantages.tolist() == [[0, 0, 0, 1.5, 1.5], [0, -0.5, -0.5, -0.5, -0.5]]
    assert batch.tokens == 6


def test_build_batch_right_pads(step):
    batch = build_batch([step([1, 2], [3]), step([4], [5, 6, 7, 8])], [0.0, 0.0], pad_id=63)
    assert batch.input_ids.tolist() == [[1, 2, 3, 63, 63], [4, 5, 6, 7, 8]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert batch.loss_mask.tolist() == [[0, 0, 1, 0, 0], [0, 1, 1, 1, 1]]


def test_steps_of_different_episodes_stay_separate_rows(step):
    # turn 1 generates [20, 21]; a tool answers [30, 31]; turn 2 sees all of it as prompt
    first = step([1, 2, 3], [20, 21])
    second = step([1, 2, 3, 20, 21, 30, 31], [22, 23, 24])
    batch = build_batch([first, second], [1.0, 1.0], pad_id=PAD)  # no episodes: one row each
    for row, s in enumerate([first, second]):
        n = len(s.prompt_ids) + len(s.completion_ids)
        assert batch.input_ids[row, :n].tolist() == list(s.prompt_ids + s.completion_ids)
        trained = batch.input_ids[row][batch.loss_mask[row] > 0].tolist()
        assert trained == list(s.completion_ids)
    assert batch.loss_mask[1, :7].sum() == 0
    other = build_batch([first, second], [1.0, 1.0], pad_id=PAD, episodes=[0, 1])
    assert other.rows == 2


def test_multi_turn_episode_is_one_row_with_env_tokens_masked(step):
    first = step([1, 2, 3], [20, 21], logprobs=[-0.1, -0.2])
    second = step([1, 2, 3, 20, 21, 30, 31], [22, 23, 24], logprobs=[-0.3, -0.4, -0.5])
    batch = build_batch([first, second], [2.0, -1.0], pad_id=PAD, episodes=[7, 7])
    assert batch.rows == 1 and batch.episode.tolist() == [7]
    assert batch.input_ids[0].tolist() == [1, 2, 3, 20, 21, 30, 31, 22, 23, 24]
    assert batch.loss_mask[0].tolist() == [0, 0, 0, 1, 1, 0, 0, 1, 1, 1]  # env tokens 30, 31: 0
    assert batch.old_logp[0].tolist() == pytest.approx([0, 0, 0, -0.1, -0.2, 0, 0, -0.3, -0.4, -0.5])
    assert batch.advantages[0].tolist() == [0, 0, 0, 2.0, 2.0, 0, 0, -1.0, -1.0, -1.0]


def test_build_batch_rejects_malformed(step):
    with pytest.raises(RLError, match="advantages"):
        build_batch([step([1], [2])], [], pad_id=PAD)
    with pytest.raises(RLError, match="logprobs"):
        build_batch([step([1], [2, 3], logprobs=[-1.0])], [0.0], pad_id=PAD)
    with pytest.raises(RLError, match="empty prompt"):
        build_batch([step([], [2])], [0.0], pad_id=PAD)
    with pytest.raises(RLError, match="zero steps"):
        build_batch([], [], pad_id=PAD)


def test_split_trims_padding_and_keeps_rows(step):
    batch = build_batch(
        [step([1], [2]), step([1], [2, 3, 4, 5]), step([1, 2], [3])], [1.0, 2.0, 3.0], pad_id=PAD
    )
    parts = batch.split(2)
    assert [p.rows for p in parts] == [2, 1]
    assert parts[1].input_ids.tolist() == [[1, 2, 3]]
    assert parts[1].advantages.tolist() == [[0.0, 0.0, 3.0]]
    assert parts[0].input_ids.shape == (2, 5)


# ------------------------------------------------------------------ masking through the model


def test_padding_ids_do_not_change_loss_and_masked_logp_gets_zero_grad(make_model, step):
    model = make_model()
    steps = [step([3, 4, 5], [6, 7]), step([3], [8, 9, 10, 11, 12])]
    batch = build_batch(steps, [1.0, -1.0], pad_id=PAD)
    other = batch.input_ids.clone()
    other[batch.attention_mask == 0] = 41  # garbage in the padding after the short completion
    cfg = RLConfig()
    loss_fn = get_policy_loss(cfg.loss)

    def loss_of(ids, leaf=False):
        logp = token_logprobs(model, ids, batch.attention_mask)
        if leaf:
            logp = logp.detach().requires_grad_(True)
        inp = LossInputs(
            logp=logp,
            old_logp=logp.detach(),  # on-policy, as the trainer does: nothing is clipped
            advantages=batch.advantages,
            mask=batch.loss_mask,
            rollout_logp=batch.old_logp,
        )
        return loss_fn(inp, cfg.loss_config()).loss, logp

    with torch.no_grad():
        a, _ = loss_of(batch.input_ids)
        b, _ = loss_of(other)
    assert a.item() == b.item()

    loss, logp = loss_of(batch.input_ids, leaf=True)
    loss.backward()
    masked = batch.loss_mask == 0
    assert torch.all(logp.grad[masked] == 0)
    assert torch.all(logp.grad[~masked] != 0)


def test_token_logprobs_alignment(make_model):
    model = make_model()
    ids = torch.tensor([[1, 2, 3, 4]])
    am = torch.ones_like(ids)
    with torch.no_grad():
        got = token_logprobs(model, ids, am, temperature=0.5)
        logits = model(input_ids=ids).logits.float() / 0.5  # (1, 4, V)
    want = torch.log_softmax(logits, -1)[0, torch.arange(3), ids[0, 1:]]
    assert got[0, 0] == 0
    torch.testing.assert_close(got[0, 1:], want)


def test_token_logprobs_of_wanted_tokens_only_equal_the_full_ones(make_model, step):
    """The LM head runs on the loss tokens only; their logprobs (and gradients) are unchanged."""
    model = make_model()
    steps = [step([3, 4, 5, 9, 9], [6, 7]), step([3], [8, 9, 10])]
    batch = build_batch(steps, [1.0, -1.0], pad_id=PAD)
    full = token_logprobs(model, batch.input_ids, batch.attention_mask)
    some = token_logprobs(model, batch.input_ids, batch.attention_mask, wanted=batch.loss_mask)
    wanted = batch.loss_mask.bool()
    torch.testing.assert_close(some[wanted], full[wanted])
    assert torch.all(some[~wanted] == 0)
    grads = []
    for logp in (full, some):
        model.zero_grad()
        (logp * batch.loss_mask).sum().backward()
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b)


# ------------------------------------------------------------------ episode_advantages


def test_grpo_advantages_on_last_steps_and_dynamic_sampling_drops_flat_groups(step, traj):
    s = [step([1], [i + 2]) for i in range(8)]
    trajs = [
        traj("a", "x", 1.0, [s[0]]),
        traj("a", "x", 0.0, [s[1]]),
        traj("a", "y", 1.0, [s[2]]),  # group (a, y): all 1.0 -> zero variance
        traj("a", "y", 1.0, [s[3]]),
        traj("b", "x", 0.0, [s[4]]),  # group (b, x): all 0.0 -> zero variance
        traj("b", "x", 0.0, [s[5]]),
    ]
    cfg = RLConfig(algorithm="grpo", dynamic_sampling=True)
    steps, adv, _ = episode_advantages(trajs, _group, cfg)
    assert steps == [s[0], s[1]]
    assert adv == pytest.approx([1.0, -1.0], abs=1e-5)

    steps, adv, _ = episode_advantages(trajs, _group, RLConfig(dynamic_sampling=False))
    assert steps == s[:6]
    assert adv[2:] == [0.0, 0.0, 0.0, 0.0]


def test_multi_step_episode_broadcasts_and_skips_tool_steps(step, traj):
    tool = ToolStep(node="t", tool="python", argument="1+1", output="2", ok=True)
    a1, a2, b1 = step([1], [2]), step([1, 2, 9], [3]), step([1], [4])
    trajs = [traj("a", "x", 1.0, [a1, tool, a2]), traj("a", "x", 0.0, [b1])]
    steps, adv, _ = episode_advantages(trajs, _group, RLConfig(algorithm="dr_grpo"))
    assert steps == [a1, a2, b1]
    assert adv == pytest.approx([0.5, 0.5, -0.5])


def test_episode_without_llm_steps_still_counts_in_the_baseline(step, traj):
    a = step([1], [2])
    trajs = [traj("a", "x", 0.0, [a]), traj("a", "x", 1.0, [])]
    steps, adv, _ = episode_advantages(trajs, _group, RLConfig(algorithm="dr_grpo"))
    assert steps == [a]
    assert adv == pytest.approx([-0.5])


def test_gigpo_maps_anchors(step, traj):
    trajs = [
        traj("a", "x", 1.0, [step([1], [2], anchor="n:s0"), step([1, 2], [3], anchor="n:s1")]),
        traj("a", "x", 0.0, [step([1], [4], anchor="n:s0")]),
    ]
    steps, adv, _ = episode_advantages(trajs, _group, RLConfig(algorithm="gigpo", gamma=1.0))
    assert len(steps) == 3
    # episode level: +-0.5; step level at anchor s0: returns 1 and 0 -> +-0.5; s1 singleton -> 0
    assert adv == pytest.approx([1.0, 0.5, -1.0])


def test_unscored_trajectory_raises(step, traj):
    t = traj("a", "x", 0.0, [step([1], [2])])
    t.reward = None
    with pytest.raises(RLError, match="unscored"):
        episode_advantages([t], _group, RLConfig())


def test_rft_keeps_top_k_successes_per_group(step, traj):
    s = [step([1], [i + 2]) for i in range(7)]
    trajs = [
        traj("a", "x", 0.5, [s[0]]),
        traj("a", "x", 1.0, [s[1], s[2]]),
        traj("a", "x", 0.0, [s[3]]),
        traj("a", "x", 0.7, [s[4]]),
        traj("b", "x", 0.0, [s[5]]),  # no success: nothing kept
        traj("b", "y", 0.2, [s[6]]),
    ]
    steps, adv, _ = episode_advantages(trajs, _group, RLConfig(algorithm="rft", rft_top_k=2))
    assert steps == [s[1], s[2], s[4], s[6]]
    assert adv == [1.0] * 4


# ------------------------------------------------------------------ config


def test_config_rejects_unknown_names_listing_known():
    with pytest.raises(ValidationError) as e:
        RLConfig(algorithm="ppo2")
    msg = str(e.value)
    assert "ppo2" in msg and "rft" in msg and "dpo" in msg
    for name in known_advantages():
        assert name in msg
    with pytest.raises(ValidationError, match="clip"):
        RLConfig(loss="nope")
    with pytest.raises(ValidationError, match="token_mean"):
        RLConfig(loss_agg="nope")
    with pytest.raises(ValidationError):
        RLConfig(group_size=1)
    with pytest.raises(ValidationError):
        RLConfig(lora_rnk=8)  # extra keys are forbidden
    with pytest.raises(ValidationError, match="reference"):
        RLConfig(full_finetune=True, kl_beta=0.1)
    with pytest.raises(ValidationError, match="reference"):
        RLConfig(full_finetune=True, algorithm="dpo")
    with pytest.raises(ValidationError, match="schedule_steps"):
        RLConfig(lr_schedule="cosine")


def test_config_sub_configs():
    cfg = RLConfig(clip_low=0.1, loss_agg="seq_sum_norm", tis_cap=None, gamma=0.5, omega=2.0)
    lc = cfg.loss_config()
    assert (lc.clip_low, lc.agg, lc.tis_cap, lc.max_completion_tokens) == (
        0.1,
        "seq_sum_norm",
        None,
        128,
    )
    ac = cfg.advantage_config()
    assert (ac.gamma, ac.omega, ac.gigpo_norm) == (0.5, 2.0, "mean")
    assert RLConfig(algorithm="rft").policy_loss == "sft"
    assert RLConfig().policy_loss == "clip"


def test_split_tokens_bounds_each_micro_batch_and_keeps_every_row(step):
    steps = [step([1] * n, [2, 3]) for n in (30, 3, 12, 5, 60, 8)]
    batch = build_batch(steps, [0.5] * 6, pad_id=PAD).by_length()
    lengths = batch.attention_mask.sum(dim=1).tolist()
    assert lengths == sorted(lengths)
    parts = batch.split_tokens(40)
    assert sum(p.rows for p in parts) == 6 and sum(p.tokens for p in parts) == batch.tokens
    for p in parts:
        assert p.rows == 1 or p.rows * p.input_ids.shape[1] <= 40
    assert parts[-1].rows == 1 and parts[-1].input_ids.shape[1] == 62  # one row over budget
    assert len(batch.split_tokens(10_000, at_least=3)) == 3
