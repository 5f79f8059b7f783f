"""Hostile code in the sandbox: each attack ends as a contained run with its reason, and the host
(this test process, its files, its other processes) is untouched."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import time
import uuid
from pathlib import Path

import pytest

from evoagent.tools import SandboxConfig, SandboxResult, run_python
from evoagent.tools.cgroup import Cgroup

HAVE_BWRAP = shutil.which("bwrap") is not None
needs_bwrap = pytest.mark.skipif(not HAVE_BWRAP, reason="bubblewrap (bwrap) not installed")


def _cgroups_work() -> bool:
    group = Cgroup.create(8, 64 * 1024 * 1024)
    if group is None:
        return False
    group.remove()
    return True


HAVE_CGROUP = _cgroups_work()
needs_cgroup = pytest.mark.skipif(not HAVE_CGROUP, reason="cannot create cgroups here (not root?)")
MODES = [pytest.param("bwrap", marks=needs_bwrap), "rlimits-only"]


def run(code: str, mode: str = "bwrap", **kw: object) -> SandboxResult:
    cfg = SandboxConfig(mode=mode, **kw)  # type: ignore[arg-type]
    return asyncio.run(run_python(code, cfg))


def alive_with(marker: str) -> list[str]:
    """Pids of live (non-zombie) processes whose command line holds ``marker``."""
    out = []
    for d in Path("/proc").iterdir():
        try:
            if marker.encode() in (d / "cmdline").read_bytes() and ") Z " not in (d / "stat").read_text():
                out.append(d.name)
        except OSError:
            continue
    return out


@needs_cgroup
@pytest.mark.parametrize("mode", MODES)
def test_fork_bomb_hits_the_task_limit(mode):
    result = run("import os\nwhile True:\n    os.fork()\n", mode, max_procs=32, timeout_s=10)
    assert result.status in ("error", "timeout", "killed"), result
    assert result.reason
    if result.status == "error":  # forks failed inside the group; the host was never short
        assert "Resource temporarily unavailable" in result.stderr


@needs_cgroup
@pytest.mark.parametrize("mode", MODES)
def test_forking_stops_at_the_task_limit_not_at_the_hosts(mode):
    code = (
        "import errno, os, time\n"
        "n = 0\n"
        "try:\n"
        "    while n < 1000:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(2); os._exit(0)\n"
        "        n += 1\n"
        "except OSError as e:\n"
        "    print(n, errno.errorcode[e.errno])\n"
    )
    result = run(code, mode, max_procs=32, timeout_s=10)
    count, why = result.stdout.split()
    assert why == "EAGAIN" and 0 < int(count) < 32, result  # without the limit: 1000 children


@pytest.mark.parametrize("mode", MODES)
def test_allocating_8gb_is_memory(mode):
    result = run("x = bytearray(8 * 1024 ** 3)\nprint(len(x))", mode, memory_mb=512)
    assert result.status == "memory" and "512 MiB" in result.reason


@needs_cgroup
@pytest.mark.parametrize("mode", MODES)
def test_many_processes_together_are_bounded_by_the_group_memory(mode):
    code = (
        "import os, time\n"
        "for _ in range(6):\n"
        "    if os.fork() == 0:\n"
        "        x = bytearray(200 * 1024 ** 2); x[::4096] = b'x' * len(x[::4096]); time.sleep(30)\n"
        "time.sleep(30)\n"
    )
    result = run(code, mode, memory_mb=512, timeout_s=5)  # 6 x 200 MiB, each under RLIMIT_AS
    assert result.status == "memory" and "all processes together" in result.reason, result


@pytest.mark.parametrize("mode", MODES)
def test_sleeping_past_the_timeout_is_killed(mode):
    start = time.monotonic()
    result = run("import time\ntime.sleep(60)\n", mode, timeout_s=1)
    assert result.status == "timeout" and "1s" in result.reason
    assert time.monotonic() - start < 10


@needs_bwrap
def test_a_home_folder_secret_is_not_readable(tmp_path):
    secret = Path("/root") / f"evoagent-secret-{uuid.uuid4().hex[:8]}"
    try:
        secret.write_text("hunter2")
    except OSError:
        pytest.skip("cannot write under /root here")
    try:
        result = run(f"print(open({str(secret)!r}).read())")
    finally:
        secret.unlink()
    assert result.status == "error" and "FileNotFoundError" in result.reason
    assert "hunter2" not in result.stdout


@needs_bwrap
def test_a_socket_cannot_reach_a_server_on_the_host():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.5)
    port = server.getsockname()[1]
    try:
        result = run(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\n")
        with pytest.raises(TimeoutError):
            server.accept()  # nothing ever arrived: the sandbox's loopback is its own
    finally:
        server.close()
    assert result.status == "error" and "ConnectionRefusedError" in result.reason, result


@pytest.mark.parametrize("mode", MODES)
def test_100mb_of_stdout_is_cut_at_the_cap(mode):
    result = run("import sys\nsys.stdout.write('x' * 100_000_000)\n", mode, max_output_bytes=65536)
    assert result.status == "output_limit" and "stdout exceeded 65536 bytes" in result.reason
    assert len(result.stdout) <= 65536


@needs_bwrap
def test_killing_every_visible_process_leaves_the_host_alone():
    code = (
        "import os, signal\n"
        "for pid in [int(p) for p in os.listdir('/proc') if p.isdigit()]:\n"
        "    if pid != os.getpid():\n"
        "        try:\n"
        "            os.kill(pid, signal.SIGKILL)\n"
        "        except OSError:\n"
        "            pass\n"
        "os.kill(os.getppid(), signal.SIGKILL)\n"
        "print('still here', os.getppid())\n"
    )
    result = run(code)
    assert result.ok and result.stdout.startswith("still here"), result
    assert os.getppid() > 1  # this test process (and its parent) survived


@pytest.mark.parametrize("mode", [pytest.param("bwrap", marks=needs_bwrap),
                                  pytest.param("rlimits-only", marks=needs_cgroup)])
def test_a_child_that_ignores_sigterm_and_leaves_the_session_dies_with_the_run(mode):
    marker = f"evoagent-stray-{uuid.uuid4().hex[:8]}"
    stray = (
        "import os, signal, time; os.setsid(); signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "time.sleep(120)"
    )
    code = (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', {stray!r}, {marker!r}], start_new_session=True)\n"
        "time.sleep(0.5)\n"
        "print('parent done')\n"
    )
    result = run(code, mode, timeout_s=5)
    assert result.ok and "parent done" in result.stdout
    time.sleep(0.3)
    assert alive_with(marker) == []

