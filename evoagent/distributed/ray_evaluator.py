"""Candidate evaluation on Ray actors that each hold a backend (extra ``evoagent-ml[distributed]``).

``evoagent run task.yaml --ray [ADDRESS]`` keeps the search on the driver: the archive, the
mutator, the RL trainer and its rollouts stay there. Only the scoring of graphs moves: each
``evaluate`` call (a child's cascade stage, a seed, a re-score after an RL phase, the final test)
is one task on one ``EvalWorker``, whichever is free. Every worker builds the run's policy
backend from the spec; after an RL phase the driver sends the trained weights (the LoRA state
dict, a few MB) and each worker serves them under the new version. Request seeds depend on
the run seed, the input and the node only, so a worker produces the tokens the driver would;
in float32 (batch-invariant decoding) the archive equals a local run's.

A worker that dies mid-evaluation (its process killed, its node lost) raises
``RayActorError`` on the driver: the evaluation is resubmitted to another worker, a
replacement is started with the current weights, and nothing is lost. When no worker is left
at all the evaluation fails as a ``BackendError`` (the loop then stops the run cleanly).

Budgets (``evolve.max_calls``): each answer carries its worker's usage so far, and the driver
counts the workers' with its own backends' (the mutator, the RL rollouts). Each worker has its
own completion cache, so a --ray run generates more completions than a local one would.

GPU workers: with ``policy.kind: vllm`` and GPUs in the cluster, each worker takes one GPU.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from evoagent.errors import BackendError
from evoagent.execute.evaluate import Evaluation, OnDone
from evoagent.execute.trajectory import Trajectory
from evoagent.graph.model import AgentGraph
from evoagent.llm.types import Usage
from evoagent.spec.config import RunSpec
from evoagent.tasks.datasets import Example

INSTALL = "pip install 'evoagent-ml[distributed]'"
RETRIES = 3  # resubmissions of one evaluation after its worker died


def check_address(address: str, timeout_s: float = 5.0) -> None:
    """Something answers at ``host:port`` (``ray.init`` itself waits minutes on a dead one)."""
    if address == "auto":
        return
    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise BackendError(f"--ray: {address!r} is not host:port (or 'local' for a local cluster)")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise BackendError(f"--ray: no Ray cluster answers at {address} ({e.strerror or type(e).__name__})") from None


def import_ray() -> Any:
    """The ray module; a clear error naming the extra without it."""
    try:
        import ray
    except ImportError:
        raise BackendError(f"--ray needs Ray, which is not installed: {INSTALL}") from None
    return ray


class EvalWorker:
    """A Ray actor (async): the run's policy backend and executor context, nothing else."""

    def __init__(self, spec_json: str) -> None:
        from evoagent.execute.executor import ExecContext
        from evoagent.llm.factory import make_backend
        from evoagent.tools import ToolContext

        self.spec = RunSpec.model_validate_json(spec_json)
        if self.spec.base_dir not in sys.path:  # the task's own modules (rewards, tools)
            sys.path.insert(0, self.spec.base_dir)
        self.backend = make_backend(self.spec.policy)
        self.name = uuid.uuid4().hex  # the driver counts each worker's usage under this
        self.ctx = ExecContext(self.backend, ToolContext(self.spec.sandbox), seed=self.spec.seed,
                               concurrency=self.spec.concurrency,
                               node_adapters=self.spec.rl.per_node)
        self._trained: Any = None

    async def evaluate(
        self, graph_json: str, examples: list[dict[str, Any]], version: int
    ) -> tuple[list[str], str, int, int]:
        """Trajectories (JSON) of ``graph`` on ``examples`` under weights ``version``, with this
        worker's name and what its model has generated so far (completions, tokens)."""
        from evoagent.execute.evaluate import evaluate
        from evoagent.graph import graph_from_dict

        if version != self.backend.weights_version:
            raise BackendError(f"worker serves weights v{self.backend.weights_version}, asked for v{version}")
        graph = graph_from_dict(json.loads(graph_json), "graph from the driver")
        ev = await evaluate(graph, [Example(**e) for e in examples], self.ctx, self.spec.task.reward)
        used = self.backend.usage
        return [t.to_json() for t in ev.trajectories], self.name, used.calls, used.tokens

    def load(self, weights: dict[str, Any], version: int) -> int:
        """Serve trained ``weights`` (as a checkpoint holds them) as ``version``."""
        from evoagent.rl.policy import load_trained

        self._trained = load_trained(self._trained or self.backend.trainable_model(), weights, self.spec.rl)
        self.backend.sync_weights(self._trained)
        self.backend.weights_version = version
        return version

    async def aclose(self) -> None:
        await self.ctx.user.aclose()
        await self.backend.aclose()


class RayEvaluator:
    """The ``Evaluator`` of ``--ray``: one evaluation per free worker, retried on worker death."""

    def __init__(
        self, spec: RunSpec, address: str | None, workers: int, log: Callable[[str], None] = print
    ) -> None:
        if address:
            check_address(address)
        ray = import_ray()
        self.ray = ray
        self.spec = spec
        if not ray.is_initialized():
            try:
                if address:
                    ray.init(address=address, log_to_driver=False)
                else:  # a local cluster for this run
                    ray.init(include_dashboard=False, log_to_driver=False,
                             object_store_memory=256 * 2**20)
            except Exception as e:  # ConnectionError, timeouts: Ray's own words say which
                raise BackendError(f"--ray: no Ray cluster at {address or 'a new local one'}: "
                                   f"{type(e).__name__}: {e}") from None
        gpus = ray.cluster_resources().get("GPU", 0)
        per = {"num_gpus": 1} if spec.policy.kind == "vllm" and gpus >= 1 else {"num_cpus": 1}
        # each worker's torch gets one core unless the spec says otherwise
        policy = spec.policy if spec.policy.threads else spec.policy.model_copy(update={"threads": 1})
        self._spec_json = spec.model_copy(update={"policy": policy}).model_dump_json()
        self._actor = ray.remote(max_restarts=0, max_concurrency=64, **per)(EvalWorker)
        self._idle: asyncio.Queue[Any] | None = None
        self._workers = [self._actor.remote(self._spec_json) for _ in range(workers)]
        self._weights: tuple[Any, int] | None = None  # (object ref, version) served now
        self.version = 0
        self.resubmitted = 0
        self._spent: dict[str, tuple[int, int]] = {}  # worker name -> its latest (calls, tokens)
        self._requests = 0  # completions the workers were asked for: one per LLM step returned
        self.log = log

    async def evaluate(self, graph: AgentGraph, examples: Sequence[Example], on_done: OnDone = None) -> Evaluation:
        idle = self._queue()
        payload = (graph.model_dump_json(), [_example(e) for e in examples], self.version)
        start = time.perf_counter()
        for attempt in range(RETRIES + 1):
            worker = await idle.get()
            try:
                raw, name, calls, tokens = await worker.evaluate.remote(*payload)
            except self.ray.exceptions.RayActorError:
                self.resubmitted += 1
                self.log(f"a Ray worker died evaluating {graph.id}; resubmitted to another worker")
                self._workers.remove(worker)
                idle.put_nowait(await self._replacement())
                continue
            except self.ray.exceptions.RayTaskError as e:
                idle.put_nowait(worker)
                raise BackendError(f"a Ray worker failed to evaluate: {e}") from None
            idle.put_nowait(worker)
            self._spent[name] = max(self._spent.get(name, (0, 0)), (calls, tokens))
            trajectories = [Trajectory.from_json(t) for t in raw]
            self._requests += sum(len(t.llm_steps) for t in trajectories)
            for _ in trajectories:
                if on_done is not None:
                    on_done()
            return Evaluation.of(trajectories, self.version, time.perf_counter() - start)
        raise BackendError(f"Ray workers died {RETRIES + 1} times evaluating {graph.id}")

    def usage(self) -> Usage:
        """What the workers' models generated, as their last answers reported it (a dead
        worker's count stays; what it generated after its last answer is not known)."""
        return Usage(sum(c for c, _ in self._spent.values()), sum(t for _, t in self._spent.values()),
                     self._requests)

    async def sync(self, weights: dict[str, Any], version: int) -> None:
        """Every worker serves ``weights`` as ``version`` before the next evaluation."""
        ref = self.ray.put({k: v.detach().cpu() for k, v in weights.items()})
        self._weights = (ref, version)
        await asyncio.gather(*(w.load.remote(ref, version) for w in self._workers))
        self.version = version

    async def aclose(self) -> None:
        for w in self._workers:
            self.ray.kill(w)
        self.ray.shutdown()

    def _queue(self) -> asyncio.Queue[Any]:
        if self._idle is None:
            self._idle = asyncio.Queue()
            for w in self._workers:
                self._idle.put_nowait(w)
        return self._idle

    async def _replacement(self) -> Any:
        """A new worker in place of a dead one, serving the current weights."""
        worker = self._actor.remote(self._spec_json)
        if self._weights is not None:
            await worker.load.remote(*self._weights)
        self._workers.append(worker)
        return worker


def _example(e: Example) -> dict[str, Any]:
    return {"id": e.id, "input": e.input, "answer": e.answer, "meta": dict(e.meta)}
