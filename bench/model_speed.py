"""What each embedded model costs on this machine: load time, peak RSS, generation speed at
batch 1 and batch 16, and one LoRA GRPO step, each against the default SmolLM2-135M measured in
the same run.

Per model and repeat, a fresh process (so load time and peak RSS are its own) builds evoagent's
``hf`` backend on the model's converted folder (``policy.dtype: auto``; the one-time assembly
and conversion is done before any timing), then:

- ``load_s``: building the backend (tokenizer, weights, the generation copy);
- ``tok_s_batch1``: greedy completions of at most 64 tokens for 3 prompts, one request per call;
- ``tok_s_batch16``: the same for 16 prompts in one call (generated tokens per second of wall);
- ``rl_step_s``: one GRPO step through ``RLPhase.train`` as ``evoagent run`` does it (4 prompts x
  4 samples at temperature 1, at most 32 tokens, LoRA r=16 on every projection; rollouts, the
  update, the weight sync), after one warm-up step; for the 135M baseline and the Qwen models;
- ``peak_rss_mb``: the process's peak resident memory (``VmHWM``: getrusage's ``ru_maxrss``
  keeps the high-water mark across exec, so a worker forked from a parent that just converted
  the 1.5B would report the parent's).

Every figure is the median over ``--repeats`` processes; each model's ratios divide by the
135M's medians (``x_default``). Writes ``bench/results/model_speed.json``.

    python bench/model_speed.py [--models embedded,embedded:qwen2.5-coder-0.5b,...] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from results_io import run_marked, write_results  # bench/ is sys.path[0] when a script runs

MODELS = (
    "embedded",
    "embedded:gemma-3-270m",
    "embedded:qwen2.5-coder-0.5b",
    "embedded:qwen2.5-coder-1.5b",
)
RL_MODELS = ("embedded", "embedded:qwen2.5-coder-0.5b", "embedded:qwen2.5-coder-1.5b")
MARK = "SPEED-RESULT "
TOPICS = (
    "a lighthouse",
    "a lost key",
    "the first snow",
    "a robot chef",
    "an old map",
    "a quiet library",
    "a broken clock",
    "a desert road",
    "a paper boat",
    "a night train",
    "a garden gnome",
    "a river",
    "a small dragon",
    "a bakery at dawn",
    "a chess match",
    "a storm at sea",
)
MAX_TOKENS = 64


def prompts(n: int) -> list[Any]:
    from evoagent.llm.types import GenerationRequest

    return [
        GenerationRequest(
            ({"role": "user", "content": f"Write a short story about {t}."},), MAX_TOKENS
        )
        for t in TOPICS[:n]
    ]


async def tokens_per_s(backend: Any, batches: list[list[Any]]) -> float:
    """Generated tokens per second over ``batches``, each one generate call."""
    before = backend.usage.tokens
    t0 = time.perf_counter()
    for batch in batches:
        await backend.generate(batch)
    return (backend.usage.tokens - before) / (time.perf_counter() - t0)


def rl_step_seconds(backend: Any, work: Path) -> float:
    """Seconds of one GRPO step (after a warm-up step) through ``RLPhase.train``."""
    import reasoning_gym as rg

    from evoagent.execute.executor import ExecContext
    from evoagent.graph.model import AgentGraph, LLMNode
    from evoagent.rl.config import RLConfig
    from evoagent.rl.phase import RLPhase
    from evoagent.spec.config import RewardConfig
    from evoagent.tasks.datasets import Example
    from evoagent.tools import ToolContext

    data = rg.create_dataset("chain_sum", seed=3, size=8, min_terms=2, max_terms=2, max_digits=1)
    train = [Example(str(i), e["question"], str(e["answer"])) for i, e in enumerate(data)]
    graph = AgentGraph(entry="a", exit="a", nodes=(LLMNode(id="a", max_tokens=32),))
    cfg = RLConfig(
        enabled=True,
        group_size=4,
        inputs_per_step=4,
        steps=1,
        lr=1e-5,
        lora_rank=16,
        max_completion_tokens=32,
        dynamic_sampling=False,
        temperature=1.0,
    )
    rl = RLPhase(
        cfg,
        backend,
        ExecContext(backend, ToolContext(), seed=0),
        RewardConfig(kind="numeric", extract="last_number"),
        work,
        seed=0,
    )
    times = []
    for step in range(2):
        t0 = time.perf_counter()
        asyncio.run(rl.train([graph], train[4 * step : 4 * step + 4], generation=step))
        times.append(time.perf_counter() - t0)
    return times[1]


def worker(model: str) -> dict[str, Any]:
    """One repeat of one model, in this (fresh) process."""
    import torch

    from evoagent.llm.hardware import resolve_device, resolve_dtype
    from evoagent.llm.hf import HFBackend
    from evoagent.spec.config import BackendConfig

    torch.manual_seed(0)
    cfg = BackendConfig(model=model, cache=False, max_batch=16, kv_cache_mb=0)
    t0 = time.perf_counter()
    backend = HFBackend(cfg)
    out: dict[str, Any] = {
        "load_s": time.perf_counter() - t0,
        "dtype": resolve_dtype(cfg.dtype, resolve_device(cfg.device)),
    }
    asyncio.run(backend.generate(prompts(1)))  # warm-up
    out["tok_s_batch1"] = asyncio.run(tokens_per_s(backend, [[p] for p in prompts(3)]))
    out["tok_s_batch16"] = asyncio.run(tokens_per_s(backend, [prompts(16)]))
    if model in RL_MODELS:
        with tempfile.TemporaryDirectory() as work:
            out["rl_step_s"] = rl_step_seconds(backend, Path(work))
    out["peak_rss_mb"] = peak_rss_mb()
    return out


def peak_rss_mb() -> float:
    """This process image's own peak resident memory: ``VmHWM`` belongs to the memory map that
    exec made, where ``ru_maxrss`` also counts the map it replaced (the forking parent's)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status: peak RSS needs Linux")


def main(models: list[str], repeats: int) -> None:
    from evoagent.llm.catalogue import lookup
    from evoagent.llm.embedded import model_folder

    if "embedded" not in models:
        models = ["embedded", *models]  # the baseline every ratio divides by
    for m in models:
        model_folder(m)  # assembled and converted once, before any timing
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in models}
    for i in range(repeats):
        for m in models:
            r = run_marked([sys.executable, __file__, "--worker", m], MARK, f"{m} (repeat {i + 1})")
            print(
                f"{m} repeat {i + 1}: "
                + ", ".join(
                    f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items()
                ),
                flush=True,
            )
            runs[m].append(r)
    keys = ("load_s", "tok_s_batch1", "tok_s_batch16", "rl_step_s", "peak_rss_mb")
    med = {
        m: {k: round(statistics.median(r[k] for r in rs), 2) for k in keys if k in rs[0]}
        for m, rs in runs.items()
    }
    figures: dict[str, Any] = {
        "max_tokens": MAX_TOKENS,
        "repeats": repeats,
        "machine": platform.machine(),
        "cores": len(os.sched_getaffinity(0)),
        "models": {},
    }
    base = med["embedded"]
    for m in models:
        entry = lookup(m)
        ratios = {f"{k}_x_default": round(med[m][k] / base[k], 2) for k in med[m] if k in base}
        figures["models"][m] = {
            "title": entry.title,
            "license": entry.license,
            "dtype": runs[m][0]["dtype"],
            **med[m],
            **ratios,
            "runs": runs[m],
        }
        print(f"{m}: " + ", ".join(f"{k} {v}" for k, v in {**med[m], **ratios}.items()), flush=True)
    write_results("model_speed", figures)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated model names")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print(MARK + __import__("json").dumps(worker(a.worker)), flush=True)
    else:
        main([m.strip() for m in a.models.split(",") if m.strip()], a.repeats)
