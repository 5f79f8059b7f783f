"""Take an archived agent out of the search: run it once on an input (``archive replay``), or
export it to a folder that runs on its own (``archive export``).

An agent is a graph *and* the policy weights it was scored with: its weights version is the
newest one under which it has a full val score, and that version's RL checkpoint (a LoRA
adapter over the run's policy model) is loaded with it. The export writes the adapter in
peft's own format (``adapter_config.json`` + ``adapter_model.safetensors``; with
``rl.adapters: per_node`` one such folder per node, ``adapter/<node id>/``), so any peft user
can load it, next to the graph YAML and a ``run.py`` that runs the agent with evoagent's
executor and nothing of its search.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from evoagent.archive.store import Archive
from evoagent.errors import ArchiveError, EvoagentError, RLError
from evoagent.execute.executor import ExecContext, execute
from evoagent.execute.trajectory import Trajectory
from evoagent.graph.io import dump_graph, load_graph
from evoagent.graph.model import AgentGraph
from evoagent.llm.backend import SupportsTraining
from evoagent.llm.factory import make_backend
from evoagent.rl.config import RLConfig
from evoagent.rl.policy import by_node, load_trained, lora_config
from evoagent.spec.config import BackendConfig, RunSpec, TaskConfig
from evoagent.tasks.datasets import Example, data_seed, load_examples
from evoagent.tools import SandboxConfig, ToolContext

ADAPTER_DIR = "adapter"


@dataclass(frozen=True)
class ArchivedAgent:
    """An agent with what it needs to run: its graph, the run's policy, sandbox and seed, and
    the weights it was scored with (``checkpoint``: a trainer checkpoint, or None for v0)."""

    id: str
    graph: AgentGraph
    policy: BackendConfig
    sandbox: SandboxConfig
    seed: int
    rl: RLConfig
    weights_version: int
    checkpoint: Path | None = None
    task: TaskConfig | None = None  # the run's data: ``run_once`` can replay one of its examples
    base_dir: Path = Path(".")


def archived_agent(archive: Archive, agent_id: str) -> ArchivedAgent:
    """Resolve ``agent_id`` (or a unique prefix) to a runnable agent of ``archive``."""
    rec = archive.agent(agent_id)
    if rec.graph is None:
        raise ArchiveError(f"{rec.id} has no graph ({rec.status}: {rec.reason})")
    stored = archive.run_spec()
    if stored is None:
        raise ArchiveError(f"{archive.run_dir} records no run spec")
    spec = RunSpec.model_validate_json(stored)
    scored = [e.weights_version for e in archive.evaluations(rec.id) if e.split == "val" and e.stage == "full"]
    version = max(scored, default=0)
    checkpoint = None
    if version > 0:
        rows = [r for r in archive.checkpoints() if r["weights_version"] == version]
        if not rows:
            raise ArchiveError(f"weights v{version} of {rec.id} has no checkpoint in {archive.run_dir}")
        checkpoint = archive.run_dir / rows[0]["path"]
    return ArchivedAgent(rec.id, rec.graph, spec.policy, spec.sandbox, spec.seed, spec.rl, version,
                         checkpoint, spec.task, Path(spec.base_dir))


def adapter_weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The trainable weights of a trainer checkpoint (a peft LoRA state dict, or all weights)."""
    try:
        state = torch.load(checkpoint, map_location="cpu", weights_only=True)
        return state["weights"]
    except (OSError, RuntimeError, KeyError, TypeError) as e:
        raise RLError(f"cannot read checkpoint {checkpoint}: {e}") from e


def replay_example(agent: ArchivedAgent, text: str) -> Example:
    """The run's example whose id is ``text`` (a game board, with the seed an env needs), or
    ``text`` itself as a new input when no example has that id or the data cannot be loaded."""
    if agent.task is not None:
        try:
            found = [ex for ex in load_examples(agent.task.dataset, data_seed(agent.task, agent.seed), agent.base_dir)
                     if ex.id == text]
        except EvoagentError:  # the task's data moved: the text is still a valid input
            found = []
        if found:
            return found[0]
    return Example("replay", text, "")


async def run_once(agent: ArchivedAgent, text: str, adapter: Path | None = None) -> Trajectory:
    """Run the agent on ``text`` (an example id of its run, or any input) with its own
    weights, greedy as it was scored.

    The weights come from ``agent.checkpoint`` or, for an exported agent, from the peft-format
    ``adapter`` folder that ``export`` wrote.
    """
    backend = make_backend(agent.policy)
    try:
        if agent.checkpoint is not None or adapter is not None:
            if not isinstance(backend, SupportsTraining):
                raise RLError(f"policy.kind {agent.policy.kind!r} cannot load trained weights")
            weights = own_weights(agent, adapter_weights(agent.checkpoint) if agent.checkpoint is not None
                                  else exported_weights(adapter, agent.rl))  # type: ignore[arg-type]
            backend.sync_weights(load_trained(backend.trainable_model(), weights, agent.rl))
        backend.weights_version = agent.weights_version
        ctx = ExecContext(backend, ToolContext(agent.sandbox), seed=agent.seed,
                          node_adapters=agent.rl.per_node)
        return await execute(agent.graph, replay_example(agent, text), ctx)
    finally:
        await backend.aclose()


_WEIGHTS = {False: "adapter_model.safetensors", True: "model_weights.safetensors"}


def own_weights(agent: ArchivedAgent, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``weights`` as this agent needs them: per node, only its own nodes' adapters (the run's
    others would each cost a served model copy); otherwise all of them."""
    if not agent.rl.per_node:
        return weights
    own = {n.id for n in agent.graph.nodes}
    return {k: v for k, v in weights.items() if k.partition("/")[0] in own}


def exported_weights(folder: Path, rl: RLConfig) -> dict[str, torch.Tensor]:
    """The weights ``export`` wrote to ``folder``, as a checkpoint holds them."""
    if not rl.per_node:
        return load_file(str(folder / _WEIGHTS[rl.full_finetune]))
    return {f"{node.name}/{k}": v for node in sorted(folder.iterdir()) if node.is_dir()
            for k, v in load_file(str(node / _WEIGHTS[False])).items()}


def export(agent: ArchivedAgent, out: Path) -> list[Path]:
    """Write graph.yaml, agent.json (policy, sandbox, seed), the adapter and run.py to ``out``.

    Per node, only the adapters of this agent's nodes are written."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "graph.yaml").write_text(dump_graph(agent.graph.model_copy(update={"name": agent.id})))
    written = [out / "graph.yaml", out / "agent.json", out / "run.py"]
    if agent.checkpoint is not None:
        weights = {k: v.contiguous() for k, v in own_weights(agent, adapter_weights(agent.checkpoint)).items()}
        folders = {ADAPTER_DIR: weights}
        if agent.rl.per_node:
            folders = {f"{ADAPTER_DIR}/{node}": w for node, w in by_node(weights).items()}
        (out / ADAPTER_DIR).mkdir(exist_ok=True)
        for folder, state in folders.items():
            (out / folder).mkdir(exist_ok=True)
            if not agent.rl.full_finetune:
                lora_config(agent.rl).save_pretrained(str(out / folder))
            save_file(state, str(out / folder / _WEIGHTS[agent.rl.full_finetune]))
        written.append(out / ADAPTER_DIR)
    meta = {
        "id": agent.id,
        "weights_version": agent.weights_version,
        "adapter": ADAPTER_DIR if agent.checkpoint is not None else None,
        "policy": agent.policy.model_dump(mode="json"),
        "sandbox": agent.sandbox.model_dump(mode="json"),
        "seed": agent.seed,
        "rl": {"lora_rank": agent.rl.lora_rank, "lora_alpha": agent.rl.lora_alpha,
               "full_finetune": agent.rl.full_finetune, "adapters": agent.rl.adapters},
    }
    (out / "agent.json").write_text(json.dumps(meta, indent=2) + "\n")
    (out / "run.py").write_text(RUN_PY)
    return written


async def run_exported(folder: Path, text: str) -> Trajectory:
    """Run what ``export`` wrote to ``folder`` on ``text``."""
    meta = json.loads((folder / "agent.json").read_text())
    agent = ArchivedAgent(
        meta["id"], load_graph(folder / "graph.yaml"), BackendConfig(**meta["policy"]),
        SandboxConfig(**meta["sandbox"]), meta["seed"], RLConfig(**meta["rl"]),
        meta["weights_version"],
    )
    return await run_once(agent, text, folder / meta["adapter"] if meta["adapter"] else None)


RUN_PY = '''"""Run an agent exported by `evoagent archive export`: python run.py "your question"."""

import asyncio
import sys
from pathlib import Path

from evoagent.replay import run_exported

if __name__ == "__main__":
    traj = asyncio.run(run_exported(Path(__file__).resolve().parent, " ".join(sys.argv[1:])))
    if traj.error:
        sys.exit(f"error: {traj.error}")
    print(traj.output)
'''
