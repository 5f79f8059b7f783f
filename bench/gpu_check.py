"""The CUDA paths, checked and timed on a machine with a GPU (``bench/gpu_check.sh`` runs this).

Three checks, each writing ``bench/results/gpu_<name>.json``:

1. ``rl_step``: GRPO steps through ``RLPhase`` as ``evoagent run`` takes them, SmolLM2-135M in
   bfloat16 on the GPU (generation on the merged copy, training with bf16 autocast): the
   completion tokens per second of step time, the peak GPU memory, and that the weights moved
   and stayed finite.
2. ``vllm``: ``policy.kind: vllm`` on the GPU: a batch of rollouts with token ids and
   logprobs, its throughput as a ratio over the hf backend's on the same requests
   (``vllm_vs_hf``), a LoRA sync that changes the greedy outputs, and the largest gap between
   the logprobs vLLM reports and the trainer's (bf16 engine against the bf16 trainer);
   skipped, and said so, where vLLM is not installed.
3. ``backend_throughput``: ``bench/backend_throughput.py`` on the GPU (``--tag gpu``).

``--device cpu`` runs the same checks on the CPU and writes nothing: how the script itself is
tested where there is no GPU.

    python bench/gpu_check.py [--device cuda] [--steps 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from results_io import write_results  # bench/ is sys.path[0] when a script runs

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def machine(device: str) -> dict[str, Any]:
    import torch

    gpu = torch.cuda.get_device_name(0) if device.startswith("cuda") else None
    return {"device": device, "gpu": gpu, "torch": torch.__version__,
            "machine": f"{platform.machine()}, {os.cpu_count()} cores"}


def rl_step(device: str, steps: int) -> dict[str, Any]:
    """Time GRPO steps on ``device`` (4 prompts x 8 samples, 64 tokens, LoRA r=16)."""
    import reasoning_gym as rg
    import torch

    from evoagent.execute.executor import ExecContext
    from evoagent.graph.model import AgentGraph, LLMNode
    from evoagent.llm.hf import HFBackend
    from evoagent.rl.config import RLConfig
    from evoagent.rl.phase import RLPhase
    from evoagent.spec.config import BackendConfig, RewardConfig
    from evoagent.tasks.datasets import Example
    from evoagent.tools import ToolContext

    data = rg.create_dataset("chain_sum", seed=3, size=16, min_terms=2, max_terms=2, max_digits=1)
    train = [Example(str(i), e["question"], str(e["answer"])) for i, e in enumerate(data)]
    backend = HFBackend(BackendConfig(dtype="bfloat16", device=device, max_batch=64, cache=False))
    graph = AgentGraph(entry="a", exit="a", nodes=(LLMNode(id="a", max_tokens=64),))
    cfg = RLConfig(enabled=True, group_size=8, inputs_per_step=4, steps=1, lr=1e-4, lora_rank=16,
                   temperature=1.0, dynamic_sampling=False)
    with tempfile.TemporaryDirectory() as tmp:
        rl = RLPhase(cfg, backend, ExecContext(backend, ToolContext(), seed=0),
                     RewardConfig(kind="numeric", extract="last_number"), Path(tmp), seed=0)
        asyncio.run(rl.train([graph], train, generation=0))  # warm-up
        before = {k: v.clone() for k, v in rl.weights().items()}
        if device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        tokens = seconds = 0.0
        for step in range(1, steps + 1):
            t0 = time.perf_counter()
            metrics = asyncio.run(rl.train([graph], train, generation=step)).metrics
            seconds += time.perf_counter() - t0
            tokens += sum(s.get("tokens", 0.0) for s in metrics["per_step"])
        after = rl.weights()
    moved = max(float((after[k].float() - before[k].float()).abs().max()) for k in before)
    return {
        **machine(device), "steps": steps, "completion_tokens": tokens, "seconds": round(seconds, 2),
        "tokens_per_s": round(tokens / seconds, 1), "weights_moved": moved,
        "finite": all(bool(torch.isfinite(v).all()) for v in after.values()),
        "peak_gpu_mb": round(torch.cuda.max_memory_allocated() / 2**20) if device.startswith("cuda") else None,
    }


def vllm_check(device: str) -> dict[str, Any]:
    """Rollouts on vLLM, a LoRA sync, and vLLM's logprobs against the trainer's."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return {**machine(device), "skipped": "vLLM is not installed here"}
    import torch

    from evoagent.llm.factory import make_backend
    from evoagent.llm.hf import HFBackend
    from evoagent.llm.types import GenerationRequest
    from evoagent.rl.config import RLConfig
    from evoagent.rl.policy import attach_lora, token_logprobs
    from evoagent.spec.config import BackendConfig

    t0 = time.perf_counter()
    backend = make_backend(BackendConfig(kind="vllm", dtype="bfloat16", max_batch=64, cache=False,
                                         kv_cache_mb=2048, gpu_memory_utilization=0.3))
    start_s = time.perf_counter() - t0
    ask = [GenerationRequest(({"role": "user", "content": f"What is {i} + {i + 3}?"},), 48, 1.0, i)
           for i in range(32)]
    greedy = [GenerationRequest(r.messages, 48, 0.0, 0) for r in ask[:8]]
    t0 = time.perf_counter()
    gens = asyncio.run(backend.generate(ask))
    rollout_s = time.perf_counter() - t0
    hf = HFBackend(BackendConfig(dtype="bfloat16", device=device, max_batch=64, cache=False))
    t0 = time.perf_counter()
    hf_tokens = sum(len(g.completion_ids) for g in asyncio.run(hf.generate(ask)))
    hf_s = time.perf_counter() - t0
    del hf
    before = asyncio.run(backend.generate(greedy))
    model = attach_lora(backend.trainable_model(), RLConfig(enabled=True, lora_rank=16))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    t0 = time.perf_counter()
    backend.sync_weights(model)
    sync_s = time.perf_counter() - t0
    backend.weights_version = 1
    after = asyncio.run(backend.generate(greedy))
    sampled = asyncio.run(backend.generate(ask[:8]))
    gaps = []
    for g in sampled:
        ids = torch.tensor([g.prompt_ids + g.completion_ids], device=next(model.parameters()).device)
        with torch.no_grad():
            lp = token_logprobs(model.eval(), ids, torch.ones_like(ids))[0, len(g.prompt_ids):].cpu()
        gaps.append(float((torch.tensor(g.logprobs) - lp).abs().max()))
    asyncio.run(backend.aclose())
    tokens = sum(len(g.completion_ids) for g in gens)
    return {
        **machine(device), "engine_start_s": round(start_s, 1), "rollout_tokens": tokens,
        "rollout_tok_s": round(tokens / rollout_s, 1), "hf_rollout_tok_s": round(hf_tokens / hf_s, 1),
        "vllm_vs_hf": round((tokens / rollout_s) / (hf_tokens / hf_s), 2), "lora_sync_s": round(sync_s, 2),
        "greedy_changed_after_sync": sum(a.completion_ids != b.completion_ids for a, b in zip(before, after)),
        "max_logprob_gap_vs_trainer": max(gaps), "all_have_token_ids": all(len(g.completion_ids) == len(g.logprobs) > 0 for g in gens),
    }


def main(device: str, steps: int) -> None:
    """Run the checks; on a GPU write their results, on the CPU (a dry run) only print them."""
    on_gpu = device.startswith("cuda")
    for name, result in (("rl_step", rl_step(device, steps)), ("vllm", vllm_check(device))):
        print(f"{name}: {result}", flush=True)
        if on_gpu:
            write_results(f"gpu_{name}", result)
    if on_gpu:
        subprocess.run([sys.executable, str(ROOT / "bench" / "backend_throughput.py"), "--tag", "gpu",
                        "--repeats", "3"] + (["--vllm"] if _has_vllm() else []), check=True)


def _has_vllm() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args()
    main(a.device, a.steps)
