"""What RL adds to a task's reward while it trains, and never when an agent is scored.

``overlong``: DAPO's soft overlong punishment (Yu et al. 2025, eq. 13). An episode whose
completions stay within ``max_tokens - buffer`` tokens keeps its reward; inside the last
``buffer`` tokens the penalty grows linearly from 0 to 1; past ``max_tokens`` it is the full 1.
A truncated answer is then told apart from a wrong one of sensible length, without the reward
noise of scoring every cut-off episode as a plain failure.
"""

from __future__ import annotations

from evoagent.rl.config import OverlongConfig


def overlong_penalty(tokens: int, cfg: OverlongConfig) -> float:
    """The (non-positive) amount added to the reward of an episode of ``tokens`` completion
    tokens, all of its llm steps together."""
    soft = cfg.max_tokens - cfg.buffer
    if tokens <= soft:
        return 0.0
    if tokens <= cfg.max_tokens:
        return (soft - tokens) / cfg.buffer
    return -1.0
