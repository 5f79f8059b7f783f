"""Every knob of the RL phase, validated once where the spec is loaded.

``RLConfig`` is the ``rl:`` section of a task file. Names of estimators, losses and aggregations
are checked against their registries here, so nothing downstream re-checks them; a bad name
fails with the list of known ones. ``loss_config`` and ``advantage_config`` hand each registry
its own typed sub-config.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from evoagent.rl.advantages import AdvantageConfig, known_advantages
from evoagent.rl.losses import LossConfig, known_aggregations, known_policy_losses
from evoagent.rl.schedule import known_schedules
from evoagent.rl.shaping import ExplorationConfig, OverlongConfig

RFT = "rft"  # rejection-sampling fine-tuning: not an advantage estimator, see ``algorithm``
DPO = "dpo"  # preference pairs from the archive: not an advantage estimator either


class CurriculumConfig(BaseModel):
    """A self-evolving curriculum (WebRL): which train inputs a phase draws, and how hard."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = Field(
        False, description="draw train inputs by the elite's archived record on them, favouring "
        "those solved sometimes but not always (the phase's rollouts are archived for this)",
    )
    focus: float = Field(
        4.0, ge=1, description="draw weight of an input solved sometimes, against 1 for an unseen "
        "one and 1/focus for one always or never solved",
    )
    levels: tuple[dict[str, Any], ...] = Field(
        (), description="harder generator options, in order (merged over task.dataset.options); "
        "the train split moves up one level after a phase whose rollout accuracy reaches promote_at",
    )
    promote_at: float = Field(0.6, ge=0, le=1, description="rollout accuracy that moves the train split up a level")


class RLConfig(BaseModel):
    """When and how the evolving agents' own trajectories fine-tune the policy model."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = Field(False, description="run RL phases at all")
    every: int = Field(
        2, ge=1, description="schedule fixed: generations between RL phases; adaptive: "
        "generations before the first phase",
    )
    schedule: str = Field(
        "fixed", description="when a phase follows a search generation (rl/schedule.py): 'fixed', "
        "every `every` generations; 'adaptive', when the phases' measured val gain per completion "
        "(discounted, plus an exploration bonus) beats the search's. Either way a phase is never "
        "the run's last step: the run ends on a search generation under the final weights",
    )
    schedule_discount: float = Field(
        0.8, gt=0, le=1, description="adaptive: weight of a step one step older (1 = never forget)"
    )
    schedule_explore: float = Field(
        0.25, ge=0, description="adaptive: exploration bonus, in units of the largest gain per "
        "completion seen; 0 = never retry an arm that lost",
    )
    reuse_search: bool = Field(
        False, description="the phase's first step trains on the episodes the search just paid "
        "for: this generation's children on its train screen (evolve.cascade.first_stage: train), "
        "grouped by input across children, under the weights the phase starts from; the fresh "
        "rollouts of that step are saved",
    )
    rollback: bool = Field(
        True, description="serve the previous weights when a phase lowered the best agent's val "
        "by more than the noise (paired bootstrap over val inputs); its checkpoint is kept",
    )
    rollback_confidence: float = Field(
        0.9, gt=0.5, lt=1, description="share of bootstrap resamples in which val fell that "
        "counts as a drop beyond the noise",
    )
    algorithm: str = Field(
        "grpo",
        description=(
            "rl.advantages key (grpo | dr_grpo | rloo | gigpo); 'rft': keep the top-k "
            "successful samples per group, plus the archive's earlier successes on the step's "
            "inputs, and train them with the sft loss (Yuan et al. 2023); "
            "'dpo': pair a better and a worse archived trajectory of one input and train the "
            "DPO loss against the base model (Rafailov et al. 2023; ETO, Song et al. 2024)"
        ),
    )
    loss: str = Field("clip", description="rl.losses policy-loss key (clip | reinforce | sft)")
    loss_agg: str = Field(
        "token_mean", description="rl.losses aggregation key (DAPO token_mean, Dr. GRPO ...)"
    )
    group_size: int = Field(4, ge=2, description="G samples per (agent, input) group")
    inputs_per_step: int = Field(4, ge=1, description="distinct inputs per optimizer step")
    steps: int = Field(4, ge=1, description="optimizer steps per RL phase")
    lr: float = Field(1e-4, gt=0, description="AdamW learning rate")
    clip_low: float = Field(0.2, ge=0, lt=1, description="PPO clip below 1 (Schulman 2017)")
    clip_high: float = Field(0.28, ge=0, description="clip above 1; DAPO clip-higher")
    kl_beta: float = Field(0.0, ge=0, description="k3 KL weight to the base model; 0 = off")
    gamma: float = Field(0.95, ge=0, le=1, description="GiGPO step discount (Feng et al. 2025)")
    omega: float = Field(1.0, description="GiGPO weight of the step-level advantage")
    gigpo_norm: Literal["mean", "std"] = Field("mean", description="GiGPO F_norm")
    lora_rank: int = Field(16, ge=1, description="LoRA rank r (Hu et al. 2021)")
    lora_alpha: int = Field(32, ge=1, description="LoRA scaling alpha")
    full_finetune: bool = Field(False, description="train every weight instead of a LoRA adapter")
    adapters: Literal["shared", "per_node"] = Field(
        "shared", description="'shared': one LoRA adapter serves every llm node; 'per_node': one "
        "adapter per llm node id, each trained on its own node's tokens of the same episodes and "
        "served to that node only (a node no phase has trained yet runs on the base weights; "
        "policy.kind hf or vllm)",
    )
    grad_accum: int = Field(1, ge=1, description="least micro-batches per optimizer step")
    micro_batch_tokens: int = Field(
        2048, ge=1,
        description="most padded tokens (rows x width) per forward/backward; a larger batch is "
        "split and its gradients accumulated exactly (about 0.5 MB of activations per token)",
    )
    gradient_checkpointing: bool = Field(
        True, description="recompute layer activations in backward (TRL's default): long "
        "prompts (few-shot demos) cost memory per layer input only",
    )
    max_grad_norm: float = Field(1.0, gt=0, description="global gradient-norm clip")
    autocast: bool = Field(
        True, description="bf16 autocast of training forwards on a CUDA device that supports it"
    )
    dynamic_sampling: bool = Field(
        True, description="drop groups whose rewards are all equal (DAPO dynamic sampling)"
    )
    oversample: int = Field(
        1, ge=1, le=16, description="roll out oversample x inputs_per_step inputs per step and "
        "train on the inputs_per_step of them whose samples disagree (where GRPO has a gradient; "
        "DAPO's over-sampling); 1 = train on every input drawn",
    )
    spread_agents: int = Field(
        0, ge=0, le=8, description="archived agents ranked below the elite, rolled out on a step's "
        "inputs where every elite sample scored the same; such an input's samples then form one "
        "group across agents, so an input the elite always fail or always solve still has a "
        "baseline and a gradient (0 = off)",
    )
    rft_top_k: int = Field(1, ge=1, description="rft: successful episodes kept per group")
    temperature: float = Field(
        1.0, gt=0, description="sampling temperature; trainer logprobs use the same"
    )
    max_completion_tokens: int = Field(
        128, ge=1, description="completion budget; Dr. GRPO seq_sum_norm normaliser (for a "
        "multi-turn loop: the whole episode's, turns x tokens per turn)"
    )
    tis_cap: float | None = Field(
        2.0, gt=0, description="truncated importance-sampling cap (Yao et al. 2025); None = off"
    )
    elite: int = Field(1, ge=1, description="top agents whose trajectories are trained on")
    curriculum: CurriculumConfig = CurriculumConfig()
    exploration: ExplorationConfig | None = Field(
        None, description="a bonus for rarely seen observations, added to each episode's reward "
        "while RL trains (never in evaluation), so groups that all miss a sparse goal still "
        "differ: {kind: count, beta}; none = off",
    )
    overlong: OverlongConfig | None = Field(
        None, description="DAPO's soft overlong punishment on the reward RL trains on (never on "
        "scoring): {max_tokens, buffer}; none = off",
    )
    dpo_beta: float = Field(0.1, gt=0, description="dpo: inverse temperature beta of the DPO loss")
    dpo_pairs: int = Field(
        2, ge=1, description="dpo: most (better, worse) pairs per input and step"
    )
    lr_schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="learning-rate schedule over schedule_steps (transformers')"
    )
    warmup_steps: int = Field(0, ge=0, description="linear warm-up steps of the schedule")
    schedule_steps: int | None = Field(
        None, ge=1, description="optimizer steps the linear/cosine schedule decays over "
        "(all RL phases together); required for them"
    )

    @field_validator("schedule")
    @classmethod
    def _known_schedule(cls, v: str) -> str:
        if v not in known_schedules():
            raise ValueError(f"unknown schedule {v!r}; known: {known_schedules()}")
        return v

    @model_validator(mode="after")
    def _adaptive_needs_rl(self) -> RLConfig:
        if self.schedule != "fixed" and not self.enabled and "schedule" in self.model_fields_set:
            raise ValueError(f"schedule: {self.schedule!r} chooses between search generations and RL "
                             "phases, but rl.enabled is false; set rl.enabled: true or drop rl.schedule")
        return self

    @field_validator("algorithm", "loss", "loss_agg")
    @classmethod
    def _known_name(cls, v: str, info: ValidationInfo) -> str:
        known = {"algorithm": lambda: [*known_advantages(), RFT, DPO], "loss": known_policy_losses,
                 "loss_agg": known_aggregations}[info.field_name]()
        if v not in known:
            raise ValueError(f"unknown {info.field_name} {v!r}; known: {known}")
        return v

    @model_validator(mode="after")
    def _reference_exists(self) -> RLConfig:
        if self.kl_beta > 0 and self.full_finetune:
            raise ValueError(
                "kl_beta > 0 needs the base model as reference, which only LoRA keeps "
                "(disable the adapter); set full_finetune: false or kl_beta: 0"
            )
        return self

    @property
    def per_node(self) -> bool:
        """One adapter per node (``adapters: per_node``)."""
        return self.adapters == "per_node"

    @model_validator(mode="after")
    def _adapters_need_lora(self) -> RLConfig:
        if self.per_node and self.full_finetune:
            raise ValueError("adapters: per_node trains one LoRA adapter per node; full_finetune "
                             "has one set of weights (set full_finetune: false or adapters: shared)")
        return self

    @model_validator(mode="after")
    def _oversample_needs_group_advantages(self) -> RLConfig:
        if self.oversample > 1 and self.algorithm in (RFT, DPO):
            raise ValueError(
                f"oversample keeps the inputs whose samples disagree, which {self.algorithm} "
                "does not need (it learns from all-success or all-failure inputs too, with the "
                "archive's help); set oversample: 1"
            )
        return self

    @model_validator(mode="after")
    def _schedule_has_a_length(self) -> RLConfig:
        if self.lr_schedule != "constant" and self.schedule_steps is None:
            raise ValueError(f"lr_schedule {self.lr_schedule!r} needs schedule_steps")
        if self.lr_schedule != "constant" and self.warmup_steps >= (self.schedule_steps or 0):
            raise ValueError("warmup_steps must be smaller than schedule_steps")
        if self.algorithm == DPO and self.full_finetune:
            raise ValueError(
                "algorithm dpo needs the base model as reference, which only LoRA keeps "
                "(disable the adapter); set full_finetune: false"
            )
        return self

    @model_validator(mode="after")
    def _shaping_needs_advantages(self) -> RLConfig:
        for name in ("overlong", "exploration"):
            if getattr(self, name) is not None and self.algorithm in (RFT, DPO):
                raise ValueError(f"{name} shapes the reward an advantage estimator sees; {self.algorithm} "
                                 f"keeps or pairs episodes by the task's own reward: drop rl.{name}")
        return self

    @property
    def policy_loss(self) -> str:
        """The loss actually trained: ``sft`` under rft, whatever ``loss`` says."""
        return "sft" if self.algorithm == RFT else self.loss

    def loss_config(self) -> LossConfig:
        """The rl.losses sub-config."""
        return LossConfig(
            clip_low=self.clip_low,
            clip_high=self.clip_high,
            kl_beta=self.kl_beta,
            agg=self.loss_agg,
            max_completion_tokens=self.max_completion_tokens,
            tis_cap=self.tis_cap,
        )

    def advantage_config(self) -> AdvantageConfig:
        """The rl.advantages sub-config (eps keeps its default)."""
        return AdvantageConfig(gamma=self.gamma, omega=self.omega, gigpo_norm=self.gigpo_norm)
