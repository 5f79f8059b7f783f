"""What one run of an agent graph on one input leaves behind: enough to score, replay and train.

An ``LLMStep`` keeps the exact prompt and completion token ids and the logprobs the backend
sampled them with, plus the weights version that produced them; training reads these ids and
never re-tokenizes. In a ``loop`` node every turn's prompt ids extend the previous turn's prompt
and completion ids (token-in/token-out), so an episode is one token stream: the model's tokens
are its completions, and the tool or environment tokens between them are the rest of each
prompt, which the loss masks out (``policy_mask`` 0). Each LLM step also carries its GiGPO
anchor key: (graph node, hash of what it observed).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal


def anchor_key(node: str, observation: str) -> str:
    """GiGPO anchor state: the node plus a short hash of the prompt text it was shown."""
    return f"{node}:{hashlib.sha256(observation.encode()).hexdigest()[:16]}"


@dataclass(frozen=True)
class LLMStep:
    """One completion sampled by the policy at an ``llm`` (or ``loop``) node."""

    node: str
    messages: tuple[dict[str, str], ...]
    text: str
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    logprobs: tuple[float, ...]  # one per completion id, under the sampling distribution
    weights_version: int
    anchor: str
    finish_reason: Literal["stop", "length"]
    seconds: float = 0.0
    kind: Literal["llm"] = "llm"


@dataclass(frozen=True)
class ToolStep:
    """One tool call at a ``tool`` (or ``loop``) node; its output is observation, not policy."""

    node: str
    tool: str
    argument: str
    output: str
    ok: bool
    error: str | None = None
    seconds: float = 0.0
    kind: Literal["tool"] = "tool"


Step = LLMStep | ToolStep
SKIPS = {"reward": "reward failed", "context": "context full"}  # Trajectory.skip -> what it means


@dataclass
class Trajectory:
    """All steps of one execution, its final output and, once scored, its reward.

    ``error`` is set when the execution failed as a whole for this input (a node raised, a
    timeout); such a trajectory scores 0 and is kept as data, never raised. ``skip`` says why
    the sample says nothing about the policy and RL must leave it out (``"reward"``: the reward
    raised or was not a finite number; ``"context"``: the episode outgrew the context window).
    ``env_reward`` is the score of an environment episode played by a ``loop`` node; it is the
    trajectory's reward. ``feedback`` is the reward's own words on the output, if it gave any.
    """

    agent_id: str
    input_id: str
    input: str
    steps: list[Step] = field(default_factory=list)
    output: str = ""
    reward: float | None = None
    error: str | None = None
    seconds: float = 0.0
    skip: str | None = None
    env_reward: float | None = None
    feedback: str | None = None

    @property
    def llm_steps(self) -> list[LLMStep]:
        return [s for s in self.steps if isinstance(s, LLMStep)]

    @property
    def completion_tokens(self) -> int:
        return sum(len(s.completion_ids) for s in self.llm_steps)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Trajectory:
        data: dict[str, Any] = json.loads(text)
        steps: list[Step] = []
        for raw in data.pop("steps"):
            if raw["kind"] == "llm":
                raw["messages"] = tuple(raw["messages"])
                for key in ("prompt_ids", "completion_ids", "logprobs"):
                    raw[key] = tuple(raw[key])
                steps.append(LLMStep(**raw))
            else:
                steps.append(ToolStep(**raw))
        return cls(steps=steps, **data)
