"""policy.dtype: auto picks bf16 only where the hardware computes it; explicit choices stand."""

from __future__ import annotations

import pytest
import torch

from evoagent.errors import BackendError
from evoagent.llm import hardware
from evoagent.llm.hf import HFBackend
from evoagent.spec.config import BackendConfig


@pytest.mark.parametrize(("avx512_bf16", "amx", "expected"), [
    (False, False, "float32"),  # AVX2-only: bf16 would be emulated
    (True, False, "bfloat16"),
    (False, True, "bfloat16"),
])
def test_auto_on_cpu_follows_native_bf16(monkeypatch, avx512_bf16, amx, expected):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    assert hardware.resolve_dtype("auto", "cpu") == expected


def test_explicit_dtype_is_kept(monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    assert hardware.resolve_dtype("bfloat16", "cpu") == "bfloat16"
    assert hardware.resolve_dtype("float32", "cuda") == "float32"


def test_default_is_auto_and_loads_in_the_resolved_dtype(tiny_model_dir):
    cfg = BackendConfig(model=str(tiny_model_dir))
    assert cfg.dtype == "auto"
    backend = HFBackend(cfg)
    want = hardware.DTYPES[hardware.resolve_dtype("auto", "cpu")]
    assert next(backend.model.parameters()).dtype == want


def test_cuda_device_without_a_gpu_names_the_setting(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(BackendError, match="policy.device: cuda"):
        hardware.resolve_device("cuda")
    assert hardware.resolve_device("auto") == "cpu"
