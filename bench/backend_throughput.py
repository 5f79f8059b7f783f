"""How fast the executor evaluates an agent, against the backend's engine generating the same
prompts raw, one call at a time, and under a trained LoRA adapter; one run, one machine.

Workload (the main job's typical evaluation): an agent with one ``llm`` node whose system
prompt and three few-shot demos every input repeats, greedy, at most 48 new tokens, on
``--inputs`` word problems from ``examples/arithmetic``. Throughput counts completion tokens
(up to and including the end token) per second. Each repeat measures, back to back:

- ``executor``: ``evaluate`` (executor, batcher, hf backend; completion cache off);
- ``raw``: transformers' own ``model.generate`` on the same prompt ids, left-padded, in
  batches of ``policy.max_batch``, on the same model object (greedy, no logprobs);
- ``sequential``: the executor with one execution in flight (one model call at a time), on the
  first 16 inputs;
- ``lora``: the executor after ``sync_weights`` of a LoRA adapter (rank 16, random non-zero
  B: a trained adapter's shape and cost), i.e. what evaluation costs after an RL phase;
- ``lora_unmerged``: for reference, the same adapter left unmerged on the decode path (what
  the backend did before it merged).

Ratios per repeat: ``hf_vs_raw`` = executor / raw (goal >= 0.9), ``hf_vs_sequential`` =
executor / sequential (goal >= 5), ``lora_eval_ratio`` = lora / executor (goal >= 0.9); the
medians are the claims. With ``--vllm`` the same workload runs on ``policy.kind: vllm`` in a
separate process: ``vllm_vs_raw`` = executor on vLLM / ``LLM.generate`` on the same prompt ids
with the same sampling parameters (greedy, the sampled token's logprob; on a CPU on the first
16 inputs only: the CPU build is slow). Every engine is warmed up on a few inputs first.

    python bench/backend_throughput.py [--repeats 3] [--inputs 64] [--vllm] [--tag gpu]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from results_io import write_results  # bench/ is sys.path[0] when a script runs

ROOT = Path(__file__).resolve().parents[1]
MAX_TOKENS = 48
SEQUENTIAL_INPUTS = 16
VLLM_INPUTS = 16  # on a CPU: vLLM's CPU build is a correctness target; a ratio needs few inputs
SYSTEM = "Write the arithmetic expression that answers the question, and nothing else."
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def workload(n: int) -> tuple[Any, list[Any]]:
    """The demo agent and ``n`` word problems it is evaluated on (its demos are 3 others)."""
    sys.path.insert(0, str(ROOT / "examples" / "arithmetic"))
    from word_problems import generate

    from evoagent.graph.model import AgentGraph, Demo, LLMNode
    from evoagent.tasks.datasets import Example

    rows = generate(seed=0, size=n + 3)
    demos = (("Mia has 34 stickers. Mia buys 18 more. How many stickers does Mia have now?", "34 + 18"),
             ("Ben shares 96 pens equally among 4 friends. How many pens does each friend get?", "96 / 4"),
             ("Ana starts with 50 cards, finds 12 more and then loses 7. How many cards does Ana "
              "have at the end?", "50 + 12 - 7"))
    node = LLMNode(id="expr", system=SYSTEM, template="{input}", max_tokens=MAX_TOKENS,
                   demos=tuple(Demo(input=q, output=a) for q, a in demos))
    graph = AgentGraph(name="demos", entry="expr", exit="expr", nodes=(node,))
    return graph, [Example(str(r["id"]), str(r["input"]), str(r["answer"])) for r in rows[3:]]


def timed_eval(graph: Any, examples: list[Any], backend: Any, concurrency: int = 64) -> dict[str, float]:
    """Evaluate ``graph`` once; completion tokens, seconds, tokens/s."""
    from evoagent.execute.evaluate import evaluate
    from evoagent.execute.executor import ExecContext
    from evoagent.spec.config import RewardConfig
    from evoagent.tools import ToolContext

    ctx = ExecContext(backend, ToolContext(), seed=0, concurrency=concurrency)
    t0 = time.perf_counter()
    ev = asyncio.run(evaluate(graph, examples, ctx, RewardConfig()))
    seconds = time.perf_counter() - t0
    return {"tokens": ev.tokens, "seconds": seconds, "tok_s": ev.tokens / seconds, "score": ev.score}


def fresh_eval(dtype: str, inputs: int, attention: str = "") -> tuple[Any, dict[str, float]]:
    """The workload's ``timed_eval`` on a freshly loaded backend in ``dtype`` (no completion
    cache, so every call generates), after a warm-up on 4 inputs; ``attention`` names a
    transformers attention to serve with instead of the backend's own. Returns the backend too,
    for a bench that goes on to train it."""
    from evoagent.llm.hf import HFBackend
    from evoagent.spec.config import BackendConfig

    graph, examples = workload(inputs)
    backend = HFBackend(BackendConfig(dtype=dtype, max_batch=64, cache=False))
    if attention:
        backend.model.set_attn_implementation(attention)
    timed_eval(graph, examples[:4], backend)  # warm-up: first calls pay one-off costs
    return backend, timed_eval(graph, examples, backend)


def requests(graph: Any, examples: list[Any]) -> list[Any]:
    """The requests the executor makes for ``graph`` on ``examples`` (one llm node)."""
    from evoagent.execute.executor import request_seed
    from evoagent.llm.types import GenerationRequest

    node = graph.node(graph.entry)
    head = [{"role": "system", "content": node.system}]
    for d in node.demos:
        head += [{"role": "user", "content": d.input}, {"role": "assistant", "content": d.output}]
    return [GenerationRequest((*head, {"role": "user", "content": ex.input}), node.max_tokens, 0.0,
                              request_seed(0, ex.id, node.id, 0, 0)) for ex in examples]


def raw_generate(backend: Any, prompts: list[list[int]]) -> dict[str, float]:
    """transformers' ``generate`` on ``prompts`` (greedy), in left-padded batches."""
    import torch

    model, pad = backend.model, backend.pad_id
    tokens, t0 = 0, time.perf_counter()
    for start in range(0, len(prompts), backend.cfg.max_batch):
        chunk = prompts[start : start + backend.cfg.max_batch]
        width = max(len(p) for p in chunk)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=MAX_TOKENS,
                                 do_sample=False, pad_token_id=pad)
        for row in out[:, width:].tolist():
            ends = [i for i, t in enumerate(row) if t in backend.eos_ids]
            tokens += ends[0] + 1 if ends else len(row)
    seconds = time.perf_counter() - t0
    return {"tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds}


def random_adapter(backend: Any) -> Any:
    """The backend's training copy under a LoRA adapter of a trained one's shape (rank 16 on
    every projection) whose B is non-zero but small: serving it costs what serving a trained
    one costs, while the greedy outputs, the work measured, stay the base model's. (A really
    trained adapter changes what is generated, and with it the tokens per second.)"""
    import torch

    from evoagent.rl.config import RLConfig
    from evoagent.rl.policy import attach_lora

    model = attach_lora(backend.trainable_model(), RLConfig(enabled=True, lora_rank=16, lora_alpha=32))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 1e-6)
    return model


def hf_repeat(n: int) -> dict[str, Any]:
    """One repeat of every hf arm on a freshly loaded backend."""
    from evoagent.llm.hf import HFBackend
    from evoagent.spec.config import BackendConfig

    graph, examples = workload(n)
    backend = HFBackend(BackendConfig(max_batch=64, cache=False))
    prompts = [backend.chat.prompt(r) for r in requests(graph, examples)]
    timed_eval(graph, examples[:8], backend)  # warm-up: first calls pay one-off costs
    raw_generate(backend, prompts[:8])
    backend.prefixes.clear()
    arms: dict[str, Any] = {"executor": timed_eval(graph, examples, backend)}
    arms["raw"] = raw_generate(backend, prompts)
    arms["sequential"] = timed_eval(graph, examples[:SEQUENTIAL_INPUTS], backend, concurrency=1)
    adapter = random_adapter(backend)
    backend.sync_weights(adapter)
    arms["lora"] = timed_eval(graph, examples, backend)
    arms["lora"]["same_tokens_as_base"] = arms["lora"]["tokens"] == arms["executor"]["tokens"]
    unmerged = HFBackend(BackendConfig(max_batch=64, cache=False, kv_cache_mb=backend.cfg.kv_cache_mb),
                         model=adapter.get_base_model(), tokenizer=backend.tokenizer)
    arms["lora_unmerged"] = timed_eval(graph, examples, unmerged)
    ex = arms["executor"]["tok_s"]
    arms["ratios"] = {
        "hf_vs_raw": ex / arms["raw"]["tok_s"],
        "hf_vs_sequential": ex / arms["sequential"]["tok_s"],
        "lora_eval_ratio": arms["lora"]["tok_s"] / ex,
        "lora_unmerged_ratio": arms["lora_unmerged"]["tok_s"] / ex,
    }
    return arms


def vllm_repeat(n: int) -> dict[str, Any]:
    """One repeat of the executor on ``policy.kind: vllm`` against ``LLM.generate`` raw."""
    from vllm import SamplingParams, TokensPrompt

    from evoagent.llm.factory import make_backend
    from evoagent.llm.hardware import resolve_device
    from evoagent.spec.config import BackendConfig

    graph, examples = workload(n)
    examples = examples if resolve_device("auto") == "cuda" else examples[:VLLM_INPUTS]
    backend = make_backend(BackendConfig(kind="vllm", max_batch=64, cache=False))
    prompts = [TokensPrompt(prompt_token_ids=backend.chat.prompt(r)) for r in requests(graph, examples)]
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, logprobs=0, detokenize=False)
    timed_eval(graph, examples[:4], backend)  # warm-up: first calls pay one-off costs
    backend.engine.generate(prompts[:4], params, use_tqdm=False)
    arms: dict[str, Any] = {"executor": timed_eval(graph, examples, backend)}
    t0 = time.perf_counter()
    outs = backend.engine.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - t0
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    arms["raw"] = {"tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds}
    arms["ratios"] = {"vllm_vs_raw": arms["executor"]["tok_s"] / arms["raw"]["tok_s"]}
    asyncio.run(backend.aclose())
    return arms


def in_subprocess(kind: str, n: int) -> dict[str, Any]:
    """Run one repeat of ``kind`` in a fresh process (peak memory and threads per engine)."""
    proc = subprocess.run([sys.executable, __file__, "--worker", kind, "--inputs", str(n)],
                          capture_output=True, text=True, check=False)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        sys.exit(f"{kind} repeat failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(line.removeprefix("RESULT "))


def main(repeats: int, n: int, vllm: bool, tag: str) -> None:
    kinds = ["hf", "vllm"] if vllm else ["hf"]
    figures: dict[str, Any] = {
        "workload": f"1 llm node, system prompt + 3 demos, greedy, <= {MAX_TOKENS} tokens, "
                    f"{n} word problems",
        "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores",
        "device": "cuda" if tag == "gpu" else "cpu",
        "repeats": {k: [] for k in kinds},
    }
    for i in range(repeats):
        for kind in kinds:
            arms = in_subprocess(kind, n)
            figures["repeats"][kind].append(arms)
            print(f"repeat {i + 1} {kind}: " + ", ".join(
                f"{a} {v['tok_s']:.1f} tok/s" for a, v in arms.items() if a != "ratios")
                + " | " + ", ".join(f"{k} {v:.2f}" for k, v in arms["ratios"].items()), flush=True)
    goals = {"hf_vs_raw": 0.9, "hf_vs_sequential": 5.0, "lora_eval_ratio": 0.9, "vllm_vs_raw": 0.9}
    for kind in kinds:
        for key in figures["repeats"][kind][0]["ratios"]:
            values = [r["ratios"][key] for r in figures["repeats"][kind]]
            figures[f"{key}s"] = [round(v, 3) for v in values]
            figures[key] = round(statistics.median(values), 3)
            goal = f" (goal >= {goals[key]})" if key in goals else ""
            print(f"{key}: median {figures[key]:.2f}x of {figures[f'{key}s']}{goal}")
    name = f"{tag}_backend_throughput" if tag else "backend_throughput"
    write_results(name, figures, inputs=(ROOT / "examples" / "arithmetic",))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--inputs", type=int, default=64)
    ap.add_argument("--vllm", action="store_true", help="also measure policy.kind: vllm")
    ap.add_argument("--tag", default="", help="results file prefix (gpu_check.sh: gpu)")
    ap.add_argument("--worker", choices=["hf", "vllm"])
    a = ap.parse_args()
    if a.worker:
        print("RESULT " + json.dumps({"hf": hf_repeat, "vllm": vllm_repeat}[a.worker](a.inputs)), flush=True)
    else:
        main(a.repeats, a.inputs, a.vllm, a.tag)
