"""The sandbox: output comes back, limits turn into statuses, bwrap isolates fs and network."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from evoagent.errors import SandboxError
from evoagent.tools import (
    SandboxConfig,
    SandboxResult,
    ToolContext,
    check_sandbox,
    make_tool,
    run_python,
)

HAVE_BWRAP = shutil.which("bwrap") is not None
needs_bwrap = pytest.mark.skipif(not HAVE_BWRAP, reason="bubblewrap (bwrap) not installed")
MODES = [pytest.param("bwrap", marks=needs_bwrap), "rlimits-only"]


def run(code: str, mode: str = "bwrap", **kw: object) -> SandboxResult:
    files = kw.pop("files", None)
    stdin = kw.pop("stdin", "")
    cfg = SandboxConfig(mode=mode, **kw)  # type: ignore[arg-type]
    return asyncio.run(run_python(code, cfg, stdin=stdin, files=files))  # type: ignore[arg-type]


def test_config_is_frozen_and_strict() -> None:
    cfg = SandboxConfig()
    with pytest.raises(ValidationError):
        cfg.timeout_s = 3  # type: ignore[misc]
    with pytest.raises(ValidationError):
        SandboxConfig(timeout_s=0)
    with pytest.raises(ValidationError):
        SandboxConfig(mode="docker")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        SandboxConfig(memroy_mb=5)  # type: ignore[call-arg]


@pytest.mark.parametrize("mode", MODES)
def test_a_parent_holding_many_descriptors_still_starts_the_sandbox(mode: str) -> None:
    """A long run (an inference engine, many sockets) holds more descriptors than the
    sandbox's RLIMIT_NOFILE; starting the sandbox must not need a new one after the limit."""
    held = [open(os.devnull) for _ in range(3 * SandboxConfig().max_open_files)]
    try:
        result = run("print('fine')", mode)
    finally:
        for f in held:
            f.close()
    assert result.ok and result.stdout.strip() == "fine", result


@pytest.mark.parametrize("mode", MODES)
def test_prints_come_back_ok(mode: str) -> None:
    result = run("import sys\nprint('hi', sys.stdin.read())", mode, stdin="there")
    assert result.ok and result.status == "ok" and result.returncode == 0
    assert result.stdout == "hi there\n" and result.reason is None


@pytest.mark.parametrize("mode", MODES)
def test_files_are_written_beside_main(mode: str) -> None:
    # -I leaves the script folder off sys.path: files are data unless the code adds "." itself.
    code = "import sys\nsys.path.insert(0, '.')\nimport helper\nprint(open('data/x.txt').read())"
    result = run(code, mode, files={"helper.py": "", "data/x.txt": "payload"})
    assert result.stdout.strip() == "payload"


def test_files_outside_scratch_are_refused() -> None:
    with pytest.raises(ValueError):
        run("pass", "rlimits-only", files={"../evil.py": ""})


@pytest.mark.parametrize("mode", MODES)
def test_exception_is_error_with_last_stderr_line(mode: str) -> None:
    result = run("raise ValueError('boom')", mode)
    assert result.status == "error" and not result.ok
    assert result.returncode == 1 and result.reason == "ValueError: boom"


@pytest.mark.parametrize("mode", MODES)
def test_infinite_loop_times_out(mode: str) -> None:
    start = time.monotonic()
    result = run("while True:\n    pass", mode, timeout_s=1)
    assert result.status == "timeout"
    assert time.monotonic() - start < 4


def test_cpu_limit_is_a_timeout() -> None:
    result = run("while True:\n    pass", "rlimits-only", timeout_s=10, cpu_s=1)
    assert result.status == "timeout" and result.reason is not None and "cpu" in result.reason


@pytest.mark.parametrize("mode", MODES)
def test_allocating_2gb_is_memory(mode: str) -> None:
    result = run("x = bytearray(2 * 1024 ** 3)", mode, memory_mb=256)
    assert result.status == "memory"


@pytest.mark.parametrize("mode", MODES)
def test_output_flood_is_output_limit(mode: str) -> None:
    start = time.monotonic()
    result = run("while True:\n    print('x' * 1000)", mode, max_output_bytes=10_000, timeout_s=5)
    assert result.status == "output_limit"
    assert len(result.stdout.encode()) <= 10_000
    assert time.monotonic() - start < 3


@needs_bwrap
def test_bwrap_root_is_read_only_but_scratch_is_writable() -> None:
    code = (
        "import os\n"
        "open('out.txt', 'w').write('ok')\n"
        "print(open('out.txt').read())\n"
        "for p in ['/etc/evoagent-probe', '/work/evoagent-probe']:\n"
        "    try:\n"
        "        open(p, 'w').write('x')\n"
        "        print('WROTE', p)\n"
        "    except OSError as e:\n"
        "        print('denied', p)\n"
    )
    result = run(code)
    assert result.ok
    assert result.stdout.split() == [
        "ok", "denied", "/etc/evoagent-probe", "denied", "/work/evoagent-probe"
    ]
    assert not Path("/etc/evoagent-probe").exists() and not Path("/work/evoagent-probe").exists()


@needs_bwrap
def test_bwrap_has_no_network() -> None:
    result = run("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)")
    assert result.status == "error" and "OSError" in (result.reason or "")


@needs_bwrap
def test_bwrap_does_not_leak_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVOAGENT_SECRET_TOKEN", "hunter2")
    result = run("import os\nprint(os.environ.get('EVOAGENT_SECRET_TOKEN'))")
    assert result.stdout.strip() == "None"


@pytest.mark.parametrize("mode", MODES)
def test_spawned_children_die_with_the_sandbox(mode: str) -> None:
    marker = f"{os.getpid()}.{time.monotonic_ns() % 10_000}"
    code = (
        "import subprocess, time\n"
        f"procs = [subprocess.Popen(['sleep', '{marker}']) for _ in range(20)]\n"
        "while True:\n    time.sleep(1)\n"
    )
    result = run(code, mode, timeout_s=1)
    assert result.status == "timeout"
    time.sleep(0.2)
    alive = []
    for pid_dir in Path("/proc").iterdir():
        try:
            cmd = (pid_dir / "cmdline").read_bytes()
            stat = (pid_dir / "stat").read_text()
        except OSError:
            continue
        if marker.encode() in cmd and ") Z " not in stat:
            alive.append(pid_dir.name)
    assert alive == []


def test_scratch_dir_is_removed() -> None:
    result = run("import os\nprint(os.getcwd())", "rlimits-only")
    assert result.ok and not Path(result.stdout.strip()).exists()


@needs_bwrap
def test_check_sandbox_passes_here() -> None:
    assert check_sandbox(SandboxConfig()) is None


def test_missing_bwrap_raises_with_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(SandboxError, match="apt-get install bubblewrap"):
        check_sandbox(SandboxConfig())
    with pytest.raises(SandboxError, match="rlimits-only"):
        asyncio.run(run_python("print(1)", SandboxConfig()))
    warning = check_sandbox(SandboxConfig(mode="rlimits-only"))  # works anywhere, but says so
    assert warning is not None and "WITHOUT filesystem, network or process isolation" in warning


@pytest.mark.parametrize("mode", MODES)
def test_python_tool_strips_fences_and_reports_failures(mode: str) -> None:
    tool = make_tool("python")
    ctx = ToolContext(sandbox=SandboxConfig(mode=mode, timeout_s=1))  # type: ignore[arg-type]
    ok = asyncio.run(tool("```python\nprint(6 * 7)\n```", ctx))
    assert ok.ok and ok.output == "42"
    bad = asyncio.run(tool("print('partial')\n1 / 0", ctx))
    assert not bad.ok and bad.output == "partial"
    assert bad.error == "error: ZeroDivisionError: division by zero"
    long = asyncio.run(tool("print('y' * 5000)", ctx))
    assert long.ok and len(long.output) == 2000
