"""``evoagent run``'s one library call: spec → backends → archive → search (→ RL) → result."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from evoagent.archive.store import DB_NAME, Archive
from evoagent.check import check_spec
from evoagent.errors import ArchiveError, SpecError
from evoagent.evolve.hooks import NullReporter, Reporter, SearchResult
from evoagent.evolve.loop import Search
from evoagent.graph.io import dump_graph
from evoagent.llm.factory import backend_entry, make_backends
from evoagent.rl.phase import RLPhase
from evoagent.spec import load_spec
from evoagent.spec.config import RunSpec
from evoagent.tools import check_sandbox


def prepare(task: Path | str, *, output: str | None = None, resume: bool = False) -> RunSpec:
    """Load and fully check a task.yaml (no model is loaded); refuse to clobber an archive."""
    spec = load_spec(task)
    if output is not None:
        spec = spec.model_copy(update={"output": output})
    check_spec(spec)
    for field, cfg in (("policy", spec.policy), ("mutator", spec.mutator)):
        preflight = backend_entry(cfg.kind).preflight if cfg is not None else None
        if preflight is not None:
            preflight(cfg, field)  # a server that does not answer fails here, before any model loads
    db = spec.run_dir / DB_NAME
    if db.exists() and not resume:
        raise ArchiveError(
            f"{spec.run_dir} already holds an archive: pass --resume to continue it, "
            "or change the spec's name or output"
        )
    if resume and not db.exists():
        raise ArchiveError(f"--resume: no archive at {spec.run_dir} to continue")
    if resume:
        with Archive(spec.run_dir, write=False) as archive:
            stored = archive.run_spec()
        changed = spec_changes(stored, spec) if stored is not None else []
        if changed:
            raise ArchiveError(
                f"--resume: the spec differs from the one {spec.run_dir} was started with, in "
                + "; ".join(changed)
                + f". A resumed run continues the same search: only {sorted(RESUMABLE)} may "
                "change (give the run a new name to start another; a setting the task does not "
                "give may differ because its default changed: set it as the run had it)"
            )
    return spec


def load_memory(from_run: Path, spec: RunSpec) -> list[tuple[str, int]]:
    """``--memory FROM_RUN``: the insights of another run of the same task (its description,
    dataset and reward), for a new run to start from. Anything else is refused before a model
    loads: not an archive, a newer schema (``ArchiveError``), another task (``SpecError``)."""
    with Archive(from_run, write=False) as archive:
        stored = archive.run_spec()
        insights = archive.insights()
    if stored is None:
        raise ArchiveError(f"--memory: {from_run} has no run spec (a run that never started)")
    theirs = RunSpec.model_validate_json(stored).task
    differ = [k for k in ("description", "dataset", "reward") if getattr(theirs, k) != getattr(spec.task, k)]
    if differ:
        raise SpecError(f"--memory: {from_run} is a run of another task (its task.{', task.'.join(differ)} "
                        "differ from this one's); insights carry over between runs of the same task only")
    return insights


# Fields a resumed run may change: where things live, and how long the search goes on.
RESUMABLE = frozenset({"output", "base_dir", "evolve.generations", "evolve.max_calls"})


def spec_changes(stored_json: str, spec: RunSpec) -> list[str]:
    """``"field: old -> new"`` for each leaf that differs, other than ``RESUMABLE`` ones. The
    stored spec is read through today's schema first, so a setting added since the run began
    takes its default there too rather than counting as a change."""
    try:
        stored = RunSpec.model_validate_json(stored_json).model_dump(mode="json")
    except ValidationError:  # a key since removed: compare the leaves as they were stored
        stored = json.loads(stored_json)
    old, new = _leaves(stored), _leaves(spec.model_dump(mode="json"))
    return [
        f"{k}: {old.get(k, '(unset)')!r} -> {new.get(k, '(unset)')!r}"
        for k in sorted(old.keys() | new.keys())
        if k not in RESUMABLE and old.get(k) != new.get(k)
    ]


def _leaves(value: object, prefix: str = "") -> dict[str, object]:
    if isinstance(value, dict):
        out: dict[str, object] = {}
        for k, v in value.items():
            out |= _leaves(v, f"{prefix}.{k}" if prefix else str(k))
        return out
    return {prefix: value}


@dataclass(frozen=True)
class RayOptions:
    """``--ray``: where the cluster is (None: start a local one) and how many workers."""

    address: str | None = None
    workers: int = 2


async def run(
    spec: RunSpec, reporter: Reporter | None = None, ray: RayOptions | None = None,
    memory: list[tuple[str, int]] | None = None,
) -> SearchResult:
    """Run (or resume) the search of ``spec``; the best agent is exported beside the archive.
    With ``ray``, candidates are evaluated on Ray workers (``evoagent.distributed``); a new run
    starts its insight memory from ``memory`` (``load_memory``)."""
    runs_code = "python" in spec.task.tools or spec.task.reward.kind == "unit_tests"
    if runs_code and (warning := check_sandbox(spec.sandbox)):
        (reporter or NullReporter()).log(f"warning: {warning}")
    evaluator = None
    if ray is not None:  # the cluster first: an address that does not answer fails before a model loads
        from evoagent.distributed.ray_evaluator import RayEvaluator

        evaluator = RayEvaluator(spec, ray.address, ray.workers, (reporter or NullReporter()).log)
    policy, mutator = make_backends(spec.policy, spec.mutator)
    with Archive(spec.run_dir) as archive:
        search = Search(spec, policy, mutator, archive, reporter, evaluator=evaluator, memory=memory or ())
        if spec.rl.enabled:
            search.attach_rl(RLPhase(
                spec.rl, policy, search.ctx, spec.task.reward, spec.run_dir, spec.seed,
                history=lambda ids: archive.trajectories_of_inputs("train", ids),
            ))
        try:
            result = await search.run()
        finally:
            await search.evaluator.aclose()
            await search.ctx.user.aclose()
            await policy.aclose()
            if mutator is not policy:
                await mutator.aclose()
        best = archive.agent(result.best_id)
        assert best.graph is not None
        (spec.run_dir / "best.yaml").write_text(dump_graph(best.graph))
        (spec.run_dir / "result.json").write_text(json.dumps(_summary(result), indent=2))
        ckpt = [r for r in archive.checkpoints() if r["weights_version"] == result.weights_version]
        if ckpt:
            shutil.copyfile(spec.run_dir / ckpt[0]["path"], spec.run_dir / "best_adapter.pt")
    return result


def _summary(r: SearchResult) -> dict:
    return {
        "best_id": r.best_id,
        "best_val": r.best_val,
        "seed_val": r.seed_val,
        "test": r.test,
        "weights_version": r.weights_version,
        "generations": r.generations,
        "calls": r.calls,
        "tokens": r.tokens,
    }
