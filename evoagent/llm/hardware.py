"""Where the policy runs and in which weight dtype, resolved from ``policy.device``/``dtype``.

``dtype: auto`` picks bfloat16 only where the hardware computes it natively: a CUDA GPU that
supports it, or a CPU with AVX512-BF16 or AMX tiles. On a CPU without them (AVX2 only, e.g.
many AMD EPYC and older Xeon) torch emulates bf16 matmuls: generation measured 2.46x and a
LoRA forward + backward 21x *slower* than in float32 (``bench/dtype_speed.py``), while on an
AVX512-BF16 CPU bf16 was about 2x faster: no fixed default is right on both.
"""

from __future__ import annotations

import torch

from evoagent.errors import BackendError

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def resolve_device(device: str) -> str:
    """``auto`` -> the first CUDA GPU if torch sees one, else ``cpu``; a named CUDA device on a
    machine without one is refused (naming the setting)."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise BackendError(f"policy.device: {device} but this machine has no CUDA GPU torch can use")
    return device


def native_bf16(device: str) -> bool:
    """Whether ``device`` computes bfloat16 matmuls in hardware (not emulated)."""
    if device.startswith("cuda"):
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    cpu = torch.cpu
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # torch's own CPUID probes
    return any(getattr(cpu, name, lambda: False)() for name in probes)


def resolve_dtype(dtype: str, device: str) -> str:
    """The weight dtype's name: ``dtype`` itself unless it is ``auto`` (see the module doc)."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if native_bf16(device) else "float32"
