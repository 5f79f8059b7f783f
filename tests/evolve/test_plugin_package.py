"""An operator shipped in an installed package (entry-point group ``evoagent.mutations``) runs
by name from ``evoagent run``; two installed packages declaring one name are refused, naming
both. The packages are real wheels installed into this environment with pip, then removed."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OPERATOR = """\
def shout(parents, ctx):
    \"\"\"Tell the exit node to answer in capitals: a visible, deterministic change.\"\"\"
    g = parents[0]
    node = g.node(g.exit)
    return g.replace_node(node.model_copy(update={{"system": "{text}"}}))
"""
SPEC = f"""\
name: plugged
seed: 1
task:
  description: add two numbers
  dataset: {{kind: reasoning_gym, name: basic_arithmetic, size: 30}}
  splits: {{train: 0, val: 4, test: 2}}
graphs: [{ROOT}/graphs/direct.yaml]
policy: {{kind: scripted}}
evolve:
  generations: 1
  children: 2
  operators: [{{name: shout_plugin}}]
"""


def wheel(folder: Path, dist: str, module: str, text: str, name: str = "shout_plugin") -> Path:
    """A pure-Python wheel of one module declaring ``shout_plugin`` in ``evoagent.mutations``,
    written by hand so that building it needs no build backend and no network."""
    stem = dist.replace("-", "_")  # a wheel's file and .dist-info names use the normalised name
    info = f"{stem}-0.1.dist-info"
    files = {
        f"{module}.py": OPERATOR.format(text=text),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/entry_points.txt": f"[evoagent.mutations]\n{name} = {module}:shout\n",
    }
    record = [f"{name},sha256={_digest(body)},{len(body.encode())}" for name, body in files.items()]
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    path = folder / f"{stem}-0.1-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, body in files.items():
            z.writestr(name, body)
    return path


def _digest(body: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(body.encode()).digest()).rstrip(b"=").decode()


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "-q", *args], check=True, capture_output=True)


@pytest.fixture
def installed(tmp_path: Path) -> Iterator[Callable[..., None]]:
    """Install wheels for the test; every one is uninstalled afterwards, whatever happened."""
    names: list[str] = []

    def install(dist: str, module: str, text: str, name: str = "shout_plugin") -> None:
        pip("install", "--no-index", "--no-deps", str(wheel(tmp_path, dist, module, text, name)))
        names.append(dist)

    yield install
    if names:
        pip("uninstall", "-y", *names)


def run(tmp_path: Path, operator: str = "shout_plugin") -> subprocess.CompletedProcess[str]:
    (tmp_path / "task.yaml").write_text(SPEC.replace("shout_plugin", operator))
    return subprocess.run(
        [sys.executable, "-m", "evoagent", "run", str(tmp_path / "task.yaml"), "--output", str(tmp_path / "pop")],
        capture_output=True, text=True, cwd=tmp_path, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )


def test_an_installed_packages_operator_runs_by_name(tmp_path, installed):
    installed("evoagent-plugin-shout", "evoagent_plugin_shout", "ANSWER IN CAPITALS")
    done = run(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    listing = subprocess.run(
        [sys.executable, "-m", "evoagent", "archive", "list", str(tmp_path / "pop" / "plugged"), "--json"],
        capture_output=True, text=True, check=True,
    )
    children = [r for r in json.loads(listing.stdout) if r["operator"] == "shout_plugin"]
    assert children, listing.stdout
    shown = subprocess.run(
        [sys.executable, "-m", "evoagent", "archive", "show", str(tmp_path / "pop" / "plugged"), children[0]["id"]],
        capture_output=True, text=True, check=True,
    )
    assert "ANSWER IN CAPITALS" in shown.stdout


def test_two_packages_declaring_one_operator_name_are_refused_naming_both(tmp_path, installed):
    installed("evoagent-plugin-shout", "evoagent_plugin_shout", "ANSWER IN CAPITALS")
    installed("evoagent-plugin-loud", "evoagent_plugin_loud", "BE LOUD")
    done = run(tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    out = " ".join((done.stdout + done.stderr).split())
    assert "operator 'shout_plugin' is declared by more than one installed package" in out
    assert "evoagent-plugin-shout" in out and "evoagent-plugin-loud" in out
    assert "Traceback" not in out


def test_a_package_declaring_a_built_in_operators_name_is_refused_naming_it(tmp_path, installed):
    installed("evoagent-plugin-shadow", "evoagent_plugin_shadow", "SHADOW", name="bootstrap_demos")
    done = run(tmp_path, operator="bootstrap_demos")
    assert done.returncode == 2, done.stdout + done.stderr
    out = " ".join((done.stdout + done.stderr).split())
    assert "operator 'bootstrap_demos' is built in, and package 'evoagent-plugin-shadow' also declares it" in out
