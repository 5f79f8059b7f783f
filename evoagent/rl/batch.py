"""Turn scored trajectories into per-step advantages, and LLM steps into padded token tensors.

One row of a batch is one token stream of an episode: the exact ids the backend saw and
sampled, never re-tokenized. Consecutive LLM steps of one episode whose prompt extends the
previous step's prompt and completion (a ``loop`` node's turns, token-in/token-out) share one
row: ``policy_mask`` (``loss_mask``) is 1 on each turn's completion tokens and 0 on the tool and
environment tokens between them, and each turn's tokens carry that turn's advantage (GiGPO
gives turns different ones). Other steps are rows of their own (prompt masked, completion
trained). One forward pass then scores a whole multi-turn episode instead of one pass per turn.
For the loss aggregations such a row is one sequence (as in verl-agent and RAGEN):
``seq_mean_token_mean`` averages over the whole episode's tokens, and ``seq_sum_norm``'s
``max_completion_tokens`` should then be the episode's budget (turns x tokens per turn).

Alignment: every (B, L) tensor is indexed by the *target* token. ``old_logp[b, t]`` and
``loss_mask[b, t]`` describe ``input_ids[b, t]``, whose logprob the model predicts from position
``t - 1``; position 0 is never predicted and always has mask 0 and logp 0.
``policy.token_logprobs`` returns its (B, L) tensor in the same convention.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from evoagent.errors import RLError
from evoagent.execute.trajectory import LLMStep, Trajectory
from evoagent.rl.advantages import AdvantageInput, get_advantage, zero_variance_groups
from evoagent.rl.config import RFT, RLConfig
from evoagent.rl.shaping import overlong_penalty


@dataclass(frozen=True)
class TokenBatch:
    """Right-padded rows of LLM steps, aligned to the target token (see the module docstring).

    Attributes:
        input_ids: (B, L) long: prompt + completion ids, then ``pad_id``.
        attention_mask: (B, L) long: 1 on real tokens, 0 on padding.
        loss_mask: (B, L) float: 1.0 on completion tokens only.
        old_logp: (B, L) float: the backend's sampling logprob at completion tokens, 0 elsewhere.
        advantages: (B, L) float: the advantage of the step each completion token belongs to,
            0 elsewhere.
        episode: (B,) long: index of the episode (trajectory) each row comes from.
        rows: B.
        node: the llm node each row's tokens come from (``rl.adapters: per_node`` trains that
            node's adapter on them); empty when unknown.
    """

    input_ids: Tensor  # (B, L)
    attention_mask: Tensor  # (B, L)
    loss_mask: Tensor  # (B, L)
    old_logp: Tensor  # (B, L)
    advantages: Tensor  # (B, L)
    episode: Tensor  # (B,)
    rows: int
    node: tuple[str, ...] = ()

    @property
    def tokens(self) -> int:
        """Number of trained (completion) tokens."""
        return int(self.loss_mask.sum())

    def to(self, device: torch.device | str) -> TokenBatch:
        """The same batch on ``device``."""
        return TokenBatch(
            input_ids=self.input_ids.to(device),
            attention_mask=self.attention_mask.to(device),
            loss_mask=self.loss_mask.to(device),
            old_logp=self.old_logp.to(device),
            advantages=self.advantages.to(device),
            episode=self.episode.to(device),
            rows=self.rows,
            node=self.node,
        )

    def split(self, n: int) -> list[TokenBatch]:
        """At most ``n`` consecutive row chunks, each trimmed of its all-padding columns."""
        return [self._rows(idx) for idx in torch.arange(self.rows).tensor_split(min(n, self.rows))]

    def by_length(self, by_node: bool = False) -> TokenBatch:
        """The same rows, shortest first, so that consecutive chunks carry little padding;
        ``by_node``: grouped by node first (each node's rows shortest first)."""
        order = torch.argsort(self.attention_mask.sum(dim=1), stable=True).tolist()
        if by_node and self.node:
            order.sort(key=lambda i: self.node[i])  # stable: lengths stay sorted within a node
        return self._rows(torch.tensor(order, dtype=torch.long))

    def split_tokens(self, budget: int, at_least: int = 1, by_node: bool = False) -> list[TokenBatch]:
        """Consecutive row chunks of at most ``budget`` padded tokens (rows x width) each.

        A single row longer than the budget is a chunk of its own; with ``at_least``, the
        batch is first cut into that many chunks (``split``), then each is cut to the budget;
        ``by_node`` also cuts wherever the node changes, so each chunk trains one adapter.
        """
        out: list[TokenBatch] = []
        for part in self.split(at_least):
            lengths = part.attention_mask.sum(dim=1).tolist()
            start, width = 0, 0
            for row, n in enumerate(lengths):
                width_if = max(width, n)
                new_node = by_node and bool(part.node) and part.node[row] != part.node[start]
                if row > start and (new_node or width_if * (row + 1 - start) > budget):
                    out.append(part._rows(torch.arange(start, row)))
                    start, width_if = row, n
                width = width_if
            out.append(part._rows(torch.arange(start, part.rows)))
        return out

    def _rows(self, idx: Tensor) -> TokenBatch:
        """Rows ``idx`` (in that order), trimmed of all-padding columns."""
        am = self.attention_mask[idx]  # (b, L)
        width = int(am.sum(dim=1).max())
        return TokenBatch(
            input_ids=self.input_ids[idx, :width],
            attention_mask=am[:, :width],
            loss_mask=self.loss_mask[idx, :width],
            old_logp=self.old_logp[idx, :width],
            advantages=self.advantages[idx, :width],
            episode=self.episode[idx],
            rows=len(idx),
            node=tuple(self.node[i] for i in idx.tolist()) if self.node else (),
        )


def build_batch(
    steps: Sequence[LLMStep],
    advantages: Sequence[float],
    pad_id: int,
    episodes: Sequence[int] | None = None,
) -> TokenBatch:
    """Stack ``steps`` into one right-padded TokenBatch; raises RLError on malformed steps.

    With ``episodes`` (one episode index per step, steps of an episode consecutive and in
    order), a step whose prompt ids start with the previous step's prompt and completion ids
    joins that step's row (see the module docstring); without it every step is its own row.
    """
    if len(steps) != len(advantages) or (episodes is not None and len(episodes) != len(steps)):
        raise RLError(f"got {len(steps)} steps but {len(advantages)} advantages")
    if not steps:
        raise RLError("cannot build a batch from zero steps")
    eps = list(episodes) if episodes is not None else list(range(len(steps)))
    groups: list[list[int]] = []  # step indices per row
    for i, s in enumerate(steps):
        if len(s.logprobs) != len(s.completion_ids):
            raise RLError(
                f"step at node {s.node!r}: {len(s.completion_ids)} completion ids but "
                f"{len(s.logprobs)} logprobs"
            )
        if not s.prompt_ids and s.completion_ids:
            raise RLError(
                f"step at node {s.node!r}: an empty prompt cannot predict its first token"
            )
        if groups and episodes is not None and eps[groups[-1][-1]] == eps[i] and _extends(
            steps[groups[-1][-1]], s
        ):
            groups[-1].append(i)
        else:
            groups.append([i])
    width = max(len(steps[g[-1]].prompt_ids) + len(steps[g[-1]].completion_ids) for g in groups)
    b = len(groups)
    input_ids = torch.full((b, width), pad_id, dtype=torch.long)  # (B, L)
    attention_mask = torch.zeros(b, width, dtype=torch.long)  # (B, L)
    loss_mask = torch.zeros(b, width)  # (B, L)
    old_logp = torch.zeros(b, width)  # (B, L)
    adv = torch.zeros(b, width)  # (B, L)
    for row, members in enumerate(groups):
        last = steps[members[-1]]
        n = len(last.prompt_ids) + len(last.completion_ids)
        input_ids[row, :n] = torch.tensor(last.prompt_ids + last.completion_ids, dtype=torch.long)
        attention_mask[row, :n] = 1
        for i in members:
            s = steps[i]
            p, c = len(s.prompt_ids), len(s.completion_ids)
            loss_mask[row, p : p + c] = 1.0
            old_logp[row, p : p + c] = torch.tensor(s.logprobs, dtype=old_logp.dtype)
            adv[row, p : p + c] = float(advantages[i])
    return TokenBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        loss_mask=loss_mask,
        old_logp=old_logp,
        advantages=adv,
        episode=torch.tensor([eps[g[0]] for g in groups], dtype=torch.long),
        rows=b,
        node=tuple(steps[g[0]].node for g in groups),
    )


def _extends(prev: LLMStep, step: LLMStep) -> bool:
    """``step`` is ``prev``'s node's next turn: its prompt is ``prev``'s prompt and completion
    followed by more tokens (a row trains one node: ``rl.adapters: per_node``)."""
    head = prev.prompt_ids + prev.completion_ids
    return prev.node == step.node and len(step.prompt_ids) > len(head) and step.prompt_ids[: len(head)] == head


def episode_advantages(
    trajectories: Sequence[Trajectory],
    group_of: Callable[[Trajectory], Hashable],
    cfg: RLConfig,
    bonus: Sequence[float] | None = None,
) -> tuple[list[LLMStep], list[float], list[int]]:
    """Flat LLM steps to train, one advantage per step, and the index of each step's
    trajectory (for ``build_batch``'s ``episodes``), from scored trajectories.

    ``group_of`` names each episode's group (usually ``(agent_id, input_id)``). The episode reward
    sits on its last LLM step; anchors become ints for GiGPO. An episode without LLM steps still
    joins its group's baseline (through a placeholder step with a private anchor) but yields no
    rows. With ``cfg.dynamic_sampling`` a group is dropped when its returns are all equal and all
    of its step advantages are 0 (DAPO; for episode-level estimators the second half follows from
    the first, for GiGPO it keeps groups whose step level still has signal). With
    ``cfg.overlong`` each episode's reward first gets DAPO's overlong penalty, and ``bonus``
    (one per trajectory: an exploration bonus) is added to it (``rl.shaping``).

    ``cfg.algorithm == "rft"``: per group, the ``rft_top_k`` episodes with the highest reward > 0
    (earlier first on ties) keep all their steps, each with advantage 1.0; no estimator runs.

    Raises RLError for an unscored trajectory (reward None): scoring precedes training.
    """
    for t in trajectories:
        if t.reward is None:
            raise RLError(f"trajectory of agent {t.agent_id!r} on {t.input_id!r} is unscored")
    if cfg.algorithm == RFT:
        return _rft(trajectories, group_of, cfg.rft_top_k)
    rewards = [float(t.reward) for t in trajectories if t.reward is not None]  # (E,)
    if cfg.overlong is not None:
        rewards = [r + overlong_penalty(t.completion_tokens, cfg.overlong) for r, t in zip(rewards, trajectories)]
    if bonus is not None:
        rewards = [r + b for r, b in zip(rewards, bonus, strict=True)]

    group_ids: dict[Hashable, int] = {}
    anchor_ids: dict[str, int] = {}
    episode_group, step_episode, step_reward, step_anchor = [], [], [], []
    steps: list[LLMStep | None] = []  # None = placeholder of an episode without LLM steps
    for e, t in enumerate(trajectories):
        episode_group.append(group_ids.setdefault(group_of(t), len(group_ids)))
        llm = t.llm_steps
        for i, s in enumerate(llm):
            steps.append(s)
            step_episode.append(e)
            step_reward.append(rewards[e] if i == len(llm) - 1 else 0.0)
            step_anchor.append(anchor_ids.setdefault(s.anchor, len(anchor_ids)))
        if not llm:
            steps.append(None)
            step_episode.append(e)
            step_reward.append(rewards[e])
            step_anchor.append(-1 - e)  # unique: never shares an anchor group
    if not steps:
        return [], [], []
    inp = AdvantageInput(
        episode_group=torch.tensor(episode_group, dtype=torch.long),
        step_episode=torch.tensor(step_episode, dtype=torch.long),
        step_reward=torch.tensor(step_reward, dtype=torch.float64),
        step_anchor=torch.tensor(step_anchor, dtype=torch.long),
    )
    adv = get_advantage(cfg.algorithm)(inp, cfg.advantage_config()).tolist()  # (S,)

    dropped: set[int] = set()
    if cfg.dynamic_sampling:
        flat = zero_variance_groups(inp).tolist()  # (E,)
        signal: set[int] = {episode_group[e] for e, a in zip(step_episode, adv) if a != 0.0}
        dropped = {g for g, f in zip(episode_group, flat) if f and g not in signal}
    out_steps, out_adv, out_ep = [], [], []
    for kept, e, a in zip(steps, step_episode, adv):
        if kept is not None and episode_group[e] not in dropped:
            out_steps.append(kept)
            out_adv.append(float(a))
            out_ep.append(e)
    return out_steps, out_adv, out_ep


def _rft(
    trajectories: Sequence[Trajectory], group_of: Callable[[Trajectory], Hashable], k: int
) -> tuple[list[LLMStep], list[float], list[int]]:
    """All steps of the top-k rewarded (> 0) episodes per group, advantage 1.0 each."""
    groups: dict[Hashable, list[int]] = {}
    for e, t in enumerate(trajectories):
        groups.setdefault(group_of(t), []).append(e)
    steps: list[LLMStep] = []
    episodes: list[int] = []
    for members in groups.values():
        winners = [(trajectories[e].reward or 0.0, e) for e in members]
        winners = sorted((w for w in winners if w[0] > 0), key=lambda w: (-w[0], w[1]))
        for _, e in winners[:k]:  # best first; ties keep their order
            llm = trajectories[e].llm_steps
            steps.extend(llm)
            episodes.extend([e] * len(llm))
    return steps, [1.0] * len(steps), episodes


def preference_pairs(
    trajectories: Sequence[Trajectory], group_of: Callable[[Trajectory], Hashable], k: int
) -> tuple[list[LLMStep], list[int], list[tuple[int, int]]]:
    """Up to ``k`` (better, worse) pairs per group, for DPO: the i-th best episode against the
    i-th worst while its reward is strictly higher (ETO's success/failure pairs; Song et al.
    2024). Returns the LLM steps of every paired episode with its episode index (for
    ``build_batch``) and the pairs as episode indices.

    Episodes marked ``skip``, unscored, or without LLM steps never pair. Departure from ETO:
    the two sides of a pair may come from different agents, so their prompts can differ (the
    agent's own instructions are part of what the pair prefers).
    """
    groups: dict[Hashable, list[int]] = {}
    for e, t in enumerate(trajectories):
        if t.skip is None and t.reward is not None and t.llm_steps:
            groups.setdefault(group_of(t), []).append(e)
    pairs: list[tuple[int, int]] = []
    for members in groups.values():
        ranked = sorted(members, key=lambda e: (-(trajectories[e].reward or 0.0), e))
        for i in range(min(k, len(ranked) // 2)):
            better, worse = ranked[i], ranked[-1 - i]
            if (trajectories[better].reward or 0.0) > (trajectories[worse].reward or 0.0):
                pairs.append((better, worse))
    used = sorted({e for pair in pairs for e in pair})
    steps = [s for e in used for s in trajectories[e].llm_steps]
    episodes = [e for e in used for _ in trajectories[e].llm_steps]
    return steps, episodes, pairs
