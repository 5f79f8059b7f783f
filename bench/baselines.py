"""The two outside baselines of ``bench/headline.py``, each run on evoagent's own parts so that
only the method differs: the same policy backend, task, reward and splits.

- ``gepa_row``: GEPA (``gepa.optimize``, Agrawal et al. 2025) optimizing the system text of
  every llm node of the seed agent, through a ``GEPAAdapter`` that executes candidates with
  evoagent's executor and shows GEPA's reflection LM each node's replies plus the reward's
  verdict and feedback. The reflection LM is the task's mutator backend (the same model and
  sampling as evoagent's ``reflective_rewrite``). Stops when the models have generated the
  budget's completions, or at a wall-clock cap: GEPA proposes one candidate at a time, so on
  a CPU its reflection calls run one by one, unbatched.
- ``trl_grpo_row``: TRL's ``GRPOTrainer`` training the policy's weights (LoRA, the task's RL
  settings) on the seed agent's prompts, the program left as it is; then the trained adapter
  is served by evoagent's backend for the test.

Both return the row's figures plus the per-input test rewards the paired bootstrap needs.
Both keep their state in a run folder (GEPA's ``run_dir``, TRL's checkpoints) with what they
have spent (``Progress``), so a row killed partway resumes there instead of starting over.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
from pathlib import Path
from typing import Any

from evoagent.execute.evaluate import Evaluation, LocalEvaluator
from evoagent.execute.executor import ExecContext, llm_messages
from evoagent.execute.trajectory import LLMStep, Trajectory
from evoagent.graph.model import AgentGraph, LLMNode
from evoagent.llm.backend import Backend, total_usage
from evoagent.llm.factory import make_backend, make_backends
from evoagent.llm.hardware import resolve_device, resolve_dtype
from evoagent.llm.types import GenerationRequest, Message, Usage
from evoagent.spec.config import RunSpec
from evoagent.tasks.datasets import Example, task_data
from evoagent.tasks.rewards import score
from evoagent.tools import ToolContext

REFLECTION_TOKENS = 240  # what evoagent's reflective_rewrite lets the mutator write
REFLECTION_TEMPERATURE = 0.8


def splits_of(spec: RunSpec) -> dict[str, list[Example]]:
    """The run's splits exactly as evoagent draws them (``splits.test_seed``, ``exclude``)."""
    return task_data(spec.task, spec.seed, Path(spec.base_dir))[1]


def per_input(ev: Evaluation) -> dict[str, float]:
    return {t.input_id: float(t.reward or 0.0) for t in ev.trajectories}


def with_systems(graph: AgentGraph, systems: dict[str, str]) -> AgentGraph:
    """``graph`` with the system text of the named llm nodes replaced."""
    nodes = tuple(
        n.model_copy(update={"system": systems[n.id]}) if n.id in systems else n
        for n in graph.nodes
    )
    return graph.model_copy(update={"nodes": nodes})


# -- GEPA ------------------------------------------------------------------------------------
class EvoagentAdapter:
    """A ``gepa.GEPAAdapter`` whose programs are an evoagent graph's llm-node system texts.

    GEPA is synchronous; it runs in a worker thread and every model call is handed to the
    event loop that owns the backend (``asyncio.run_coroutine_threadsafe``), where the batcher
    gathers a whole minibatch into one batched generate call.
    """

    def __init__(
        self,
        graph: AgentGraph,
        evaluator: LocalEvaluator,
        loop: asyncio.AbstractEventLoop,
        answers: dict[str, str],
    ) -> None:
        self.graph = graph
        self.evaluator = evaluator
        self.loop = loop
        self.answers = answers
        self.propose_new_texts = None  # GEPA's own proposer writes the new texts

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def evaluate(
        self, batch: list[Example], candidate: dict[str, str], capture_traces: bool = False
    ) -> Any:
        from gepa import EvaluationBatch

        ev = self.run(self.evaluator.evaluate(with_systems(self.graph, candidate), batch))
        return EvaluationBatch(
            outputs=[t.output for t in ev.trajectories],
            scores=[float(t.reward or 0.0) for t in ev.trajectories],
            trajectories=list(ev.trajectories) if capture_traces else None,
        )

    def make_reflective_dataset(
        self, candidate: dict[str, str], eval_batch: Any, components_to_update: list[str]
    ) -> dict[str, list[dict[str, str]]]:
        """Per component, each example's input, that node's reply and the reward's verdict."""
        out: dict[str, list[dict[str, str]]] = {}
        for comp in components_to_update:
            records = []
            for t, s in zip(eval_batch.trajectories, eval_batch.scores, strict=True):
                replies = [st.text for st in t.steps if isinstance(st, LLMStep) and st.node == comp]
                records.append(
                    {
                        "Inputs": t.input,
                        "Generated Outputs": "\n---\n".join(replies) or "(the node did not run)",
                        "Feedback": _verdict(t, s, self.answers.get(t.input_id, "?")),
                    }
                )
            out[comp] = records
        return out


def _verdict(t: Trajectory, reward: float, answer: str) -> str:
    parts = [f"score {reward:.2f}; the correct answer is {answer}; "
             f"the agent's final output: {t.output!r}"]
    if t.error:
        parts.append(f"error: {t.error}")
    if t.feedback:
        parts.append(t.feedback)
    return ". ".join(parts)


class _Reflection:
    """GEPA's reflection LM: one completion of the mutator backend per prompt."""

    def __init__(self, backend: Backend, loop: asyncio.AbstractEventLoop) -> None:
        self.backend, self.loop, self.n = backend, loop, 0

    def __call__(self, prompt: str | list[Message]) -> str:
        messages = (
            tuple(prompt) if isinstance(prompt, list) else ({"role": "user", "content": prompt},)
        )
        self.n += 1
        req = GenerationRequest(messages, REFLECTION_TOKENS, REFLECTION_TEMPERATURE, seed=self.n)
        (gen,) = asyncio.run_coroutine_threadsafe(self.backend.generate([req]), self.loop).result()
        return gen.text


class Progress:
    """What a baseline row has spent across the processes that ran it (completions, tokens,
    seconds), kept in ``<run_dir>/progress.json`` each time the row saves its state. A row
    resumed after a kill counts what its saved state cost, not the work that died with the
    process: that work is done again and counted once."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / "progress.json"
        self.before: dict[str, float] = json.loads(self.path.read_text()) if self.path.is_file() else {}
        self.start = time.perf_counter()

    @property
    def resumed(self) -> bool:
        return bool(self.before)

    def seconds(self) -> float:
        return float(self.before.get("wall_s", 0.0)) + time.perf_counter() - self.start

    def save(self, calls: int, tokens: int) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"calls": calls, "tokens": tokens, "wall_s": round(self.seconds(), 1)}))
        os.replace(tmp, self.path)


class _GepaSpent:
    """A ``gepa.GEPACallback`` that keeps ``Progress`` beside GEPA's saved state. A resumed
    GEPA evaluates its seed on val again before it loads its state: those completions repeat
    work the state holds, so this process's count starts at GEPA's first save."""

    def __init__(self, models: list[Backend], progress: Progress) -> None:
        self.models, self.progress = models, progress
        self.base: Usage | None = None if progress.resumed else Usage()

    def usage(self) -> tuple[int, int]:
        now = total_usage(self.models)
        base = self.base or now
        before = self.progress.before
        return (int(before.get("calls", 0)) + now.calls - base.calls,
                int(before.get("tokens", 0)) + now.tokens - base.tokens)

    def on_state_saved(self, event: Any) -> None:
        if self.base is None:
            self.base = total_usage(self.models)
        self.progress.save(*self.usage())

    on_optimization_end = on_state_saved  # after GEPA's last save


async def gepa_row(
    spec: RunSpec, seed: AgentGraph, budget: int, max_minutes: float, run_dir: Path
) -> dict[str, Any]:
    """GEPA on ``seed``'s system texts until the models generated ``budget`` completions (or
    ``max_minutes`` passed); the best candidate by val is scored on test once. GEPA keeps its
    state in ``run_dir``: a row killed partway goes on from its last iteration there."""
    import gepa

    splits = splits_of(spec)
    policy, mutator = make_backends(spec.policy, spec.mutator)
    ctx = ExecContext(
        policy, ToolContext(spec.sandbox), seed=spec.seed, concurrency=spec.concurrency
    )
    evaluator = LocalEvaluator(ctx, spec.task.reward)
    loop = asyncio.get_running_loop()
    answers = {e.id: e.answer for part in splits.values() for e in part}
    adapter = EvoagentAdapter(seed, evaluator, loop, answers)
    components = {n.id: n.system for n in seed.nodes if isinstance(n, LLMNode)}
    progress = Progress(run_dir)
    spent = _GepaSpent([policy, mutator], progress)

    class _Silent:
        def log(self, message: str) -> None: ...

    stop = lambda _state: spent.usage()[0] >= budget or progress.seconds() > max_minutes * 60  # noqa: E731
    try:
        result = await asyncio.to_thread(
            gepa.optimize,
            seed_candidate=components,
            trainset=list(splits["train"]),
            valset=list(splits["val"]),
            adapter=adapter,
            reflection_lm=_Reflection(mutator, loop),
            stop_callbacks=[stop],
            callbacks=[spent],
            run_dir=str(run_dir / "gepa"),
            logger=_Silent(),
            seed=spec.seed,
        )
        calls, tokens = spent.usage()
        wall = progress.seconds()
        best = with_systems(seed, dict(result.best_candidate))
        test = await evaluator.evaluate(best, splits["test"])
    finally:
        await ctx.user.aclose()
        await policy.aclose()
        if mutator is not policy:
            await mutator.aclose()
    return {
        "test": test.score,
        "val": float(result.val_aggregate_scores[result.best_idx]),
        "calls": calls,
        "tokens": tokens,
        "wall_s": round(wall, 1),
        "candidates": result.num_candidates,
        "capped": calls < budget,  # stopped by the wall-clock cap, not the budget
        "calls_before_resume": int(progress.before.get("calls", 0)),
        "best_graph": best.model_dump(mode="json"),
        "per_input": per_input(test),
    }


# -- TRL GRPO --------------------------------------------------------------------------------
def trl_grpo_row(
    spec: RunSpec, seed: AgentGraph, budget: int, max_minutes: float, run_dir: Path
) -> dict[str, Any]:
    """TRL's GRPOTrainer on ``seed``'s prompts for ``budget`` sampled completions (or until
    ``max_minutes``), the task's GRPO settings; then the seed program is tested on the trained
    weights through evoagent's backend. A checkpoint after every step in ``run_dir`` lets a row
    killed partway go on from its last step (TRL's own ``resume_from_checkpoint``)."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from transformers.trainer_utils import get_last_checkpoint
    from trl import GRPOConfig, GRPOTrainer

    from evoagent.rl.policy import LORA_TARGETS

    llm = [n for n in seed.nodes if isinstance(n, LLMNode)]
    if len(seed.nodes) != 1 or len(llm) != 1:
        raise SystemExit(
            f"trl_grpo: the seed agent {seed.name!r} must be one llm node (TRL trains a "
            "single prompt -> completion policy)"
        )
    node, rl = llm[0], spec.rl
    splits = splits_of(spec)
    by_id = {e.id: e for e in splits["train"]}
    backend = make_backend(spec.policy)
    per_step = rl.inputs_per_step * rl.oversample * rl.group_size
    steps = max(1, budget // per_step)
    progress = Progress(run_dir)

    def reward(completions: list[list[Message]], id: list[str], **_: Any) -> list[float]:
        async def all_() -> list[float]:
            scored = [
                score(c[0]["content"], by_id[i], spec.task.reward)
                for c, i in zip(completions, id, strict=True)
            ]
            return [float(s[0]) for s in await asyncio.gather(*scored)]

        return asyncio.run(all_())

    def spent(state: Any) -> tuple[int, int]:
        """Completions and tokens of the steps done (the log history survives a resume)."""
        lengths = [float(h["completions/mean_length"]) for h in state.log_history
                   if "completions/mean_length" in h]
        return state.global_step * per_step, round(sum(lengths[: state.global_step]) * per_step)

    class Clock(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if progress.seconds() > max_minutes * 60:
                control.should_training_stop = True

        def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            progress.save(*spent(state))

    # the chat evoagent's executor sends the node (the seed is one node: no upstream outputs)
    rows = [
        {"prompt": llm_messages(node, node.template.format(input=e.input)), "id": e.id}
        for e in splits["train"]
    ]
    repeats = math.ceil(steps * per_step / rl.group_size / len(rows)) + 1
    device = resolve_device(spec.policy.device)  # where the backend put the model TRL trains
    out = run_dir / "trl"
    args = GRPOConfig(
        output_dir=str(out),
        use_cpu=device == "cpu",
        bf16=resolve_dtype(spec.policy.dtype, device) == "bfloat16",
        max_steps=steps,
        # one group per forward and backward, accumulated to one optimizer step of per_step
        # completions (TRL generates them together and normalizes the loss over all of them):
        # the same step, as evoagent's trainer takes it in micro-batches; a per_step-wide
        # forward holds every sequence's logits at once: two headline TRL cells doing that side
        # by side, beside the test suite, ran a 24 GB machine out of memory
        per_device_train_batch_size=rl.group_size,
        gradient_accumulation_steps=per_step // rl.group_size,
        num_generations=rl.group_size,
        max_completion_length=node.max_tokens,
        learning_rate=rl.lr,
        temperature=rl.temperature,
        logging_steps=1,
        report_to="none",
        save_strategy="steps",
        save_steps=1,
        save_total_limit=1,
        seed=spec.seed,
        gradient_checkpointing=rl.gradient_checkpointing,
    )
    trainer = GRPOTrainer(
        model=backend.trainable_model(),
        processing_class=backend.tokenizer,  # type: ignore[attr-defined]
        reward_funcs=[reward],
        args=args,
        train_dataset=Dataset.from_list(rows * repeats),
        callbacks=[Clock()],
        peft_config=LoraConfig(
            r=rl.lora_rank,
            lora_alpha=rl.lora_alpha,
            lora_dropout=0.0,
            target_modules=list(LORA_TARGETS),
            task_type="CAUSAL_LM",
        ),
    )
    trainer.train(resume_from_checkpoint=get_last_checkpoint(str(out)) if out.is_dir() else None)
    wall = progress.seconds()
    done = trainer.state.global_step
    calls, tokens = spent(trainer.state)

    async def test() -> Evaluation:
        backend.sync_weights(trainer.model)  # type: ignore[attr-defined]
        backend.weights_version = 1
        ctx = ExecContext(
            backend, ToolContext(spec.sandbox), seed=spec.seed, concurrency=spec.concurrency
        )
        try:
            return await LocalEvaluator(ctx, spec.task.reward).evaluate(seed, splits["test"])
        finally:
            await ctx.user.aclose()
            await backend.aclose()

    ev = asyncio.run(test())
    return {
        "test": ev.score,
        "calls": calls,
        "tokens": tokens,
        "wall_s": round(wall, 1),
        "steps": done,
        "steps_planned": steps,
        "capped": done < steps,  # stopped by the wall-clock cap, not the budget
        "calls_before_resume": int(progress.before.get("calls", 0)),
        "per_input": per_input(ev),
    }
