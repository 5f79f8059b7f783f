"""Run untrusted Python in a throwaway process: bubblewrap namespaces plus rlimits.

What is covered (mode ``bwrap``):
  - the host filesystem is mounted read-only; only a fresh scratch folder (the working
    directory, removed afterwards) and a private tmpfs ``/tmp`` are writable;
  - no network: ``--unshare-all`` gives the code an empty network namespace (no loopback up);
  - new pid, ipc, uts, user and cgroup namespaces, so killing the sandbox kills every process
    it spawned; ``--die-with-parent`` ties it to this process;
  - home folders (``hide_paths``: /root, /home) appear empty, so keys and tokens kept there
    cannot be read; the interpreter's own folders under them stay visible, read-only;
  - rlimits on CPU seconds, address space, open files, file size and process count, and a
    wall-clock timeout that kills the whole process group;
  - where cgroups can be created (root here; ``tools.cgroup``), a group per run bounds the
    number of tasks (a fork bomb's forks fail) and the memory of all processes together, and
    kills every process of the run at the end, even one that left the process group;
  - stdout/stderr are capped at ``max_output_bytes`` each; a flood kills the run;
  - the environment is replaced by a minimal one (no API keys leak in) and ``-I`` isolates
    the interpreter from ``PYTHON*`` variables and the user site folder.

What is not covered:
  - secrets readable on the host filesystem stay readable (read-only, but visible);
  - without cgroups, ``RLIMIT_NPROC`` is not enforced for root, so as root a fork bomb is
    bounded only by the timeout and the pid namespace being torn down, and ``RLIMIT_AS``
    limits virtual memory per process, not the sum over processes;
  - kernel exploits: this is a namespace sandbox, not a VM.

Mode ``rlimits-only`` runs the same interpreter without bubblewrap: rlimits, timeout, output
cap and scratch folder still apply, but there is NO filesystem or network isolation. Use it only
where bubblewrap cannot run and the code is trusted-ish (e.g. tests of the pipeline itself).
"""

from __future__ import annotations

import asyncio
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from evoagent.errors import SandboxError
from evoagent.tools.cgroup import Cgroup

SandboxStatus = Literal["ok", "error", "timeout", "memory", "output_limit", "killed"]

_INSTALL_HINT = (
    "bubblewrap (bwrap) is not usable: run `apt-get install bubblewrap`, "
    "or set sandbox.mode: rlimits-only (no filesystem or network isolation)"
)
_MEMORY_MARKERS = ("MemoryError", "Cannot allocate memory", "std::bad_alloc", "out of memory")
_CHUNK = 65536


class SandboxConfig(BaseModel):
    """Limits and isolation for one sandboxed run."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: Literal["bwrap", "rlimits-only"] = Field(
        "bwrap",
        description="bwrap: namespaces + rlimits; rlimits-only: no filesystem/network isolation",
    )
    timeout_s: float = Field(
        10.0, gt=0, description="wall-clock limit; the whole process group is killed"
    )
    cpu_s: int = Field(10, gt=0, description="RLIMIT_CPU in seconds (SIGXCPU, then SIGKILL)")
    memory_mb: int = Field(512, gt=0, description="RLIMIT_AS (virtual address space) in MiB")
    max_procs: int = Field(64, gt=0, description="RLIMIT_NPROC (not enforced for root)")
    max_file_mb: int = Field(16, gt=0, description="RLIMIT_FSIZE: largest file the code may write")
    max_open_files: int = Field(64, gt=0, description="RLIMIT_NOFILE")
    max_output_bytes: int = Field(
        65536, gt=0, description="cap on stdout and on stderr each; exceeding kills the run"
    )
    read_paths: tuple[str, ...] = Field(
        (),
        description="extra host paths bound read-only (needed under /tmp, hidden by the tmpfs)",
    )
    hide_paths: tuple[str, ...] = Field(
        ("/root", "/home"),
        description="host folders the code sees as empty (bwrap): home folders hold keys and "
        "tokens; the interpreter's own folders stay visible",
    )


@dataclass(frozen=True)
class SandboxResult:
    """What one sandboxed run did; ``reason`` explains any non-ok status."""

    status: SandboxStatus
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    reason: str | None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


RLIMITS_ONLY_WARNING = (
    "sandbox.mode is rlimits-only: generated code runs with limits but WITHOUT filesystem, "
    "network or process isolation; use it only for code you trust"
)


def check_sandbox(cfg: SandboxConfig) -> str | None:
    """Raise SandboxError unless ``cfg.mode`` can run here; return a warning for rlimits-only."""
    if cfg.mode != "bwrap":
        return RLIMITS_ONLY_WARNING
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxError(_INSTALL_HINT)
    try:
        proc = subprocess.run(
            [bwrap, "--ro-bind", "/", "/", "--unshare-all", "true"],
            capture_output=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxError(f"{_INSTALL_HINT} ({type(exc).__name__}: {exc})") from exc
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip()
        raise SandboxError(f"{_INSTALL_HINT} (bwrap exited {proc.returncode}: {err})")
    return None


async def run_python(
    code: str,
    cfg: SandboxConfig,
    *,
    stdin: str = "",
    files: Mapping[str, str] | None = None,
) -> SandboxResult:
    """Run ``code`` as ``main.py`` in a fresh scratch folder under ``cfg``'s limits.

    ``files`` maps relative paths to contents written beside ``main.py``; since ``-I`` keeps
    the script folder off ``sys.path``, code must ``sys.path.insert(0, ".")`` to import them.
    Failures of the code (exceptions, limits, timeouts) come back as a result; only a sandbox
    that cannot start raises SandboxError.
    """
    argv_prefix: list[str] = []
    if cfg.mode == "bwrap":
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            raise SandboxError(_INSTALL_HINT)
        argv_prefix = [bwrap]
    scratch = Path(tempfile.mkdtemp(prefix="evoagent-sbx-"))
    try:
        _write_files(scratch, code, files or {})
        argv = [*argv_prefix, *(_bwrap_args(scratch, cfg) if argv_prefix else [])]
        argv += [sys.executable, "-I", "main.py"]
        return await _run(argv, scratch, cfg, stdin)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _write_files(scratch: Path, code: str, files: Mapping[str, str]) -> None:
    (scratch / "main.py").write_text(code, encoding="utf-8")
    for rel, text in files.items():
        target = (scratch / rel).resolve()
        if Path(rel).is_absolute() or not target.is_relative_to(scratch.resolve()):
            raise ValueError(f"sandbox file path must be relative and inside scratch: {rel!r}")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")


def _interpreter_under(hidden: list[Path]) -> list[str]:
    """Folders of this Python (a venv, its base) that a hidden folder would cover; kept read-only."""
    roots = {Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).resolve().parent}
    return sorted(str(r) for r in roots if any(r.is_relative_to(h) and r != h for h in hidden))


def _bwrap_args(scratch: Path, cfg: SandboxConfig) -> list[str]:
    # Order matters: a tmpfs must exist before anything (the scratch, usually under /tmp; the
    # interpreter, maybe under /root) is bound into it; a bind target must lie in a writable
    # mount, not the read-only root.
    hidden = [Path("/tmp"), *(Path(p) for p in cfg.hide_paths if Path(p).is_dir())]
    args = ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    for h in hidden:
        args += ["--tmpfs", str(h)]
    for p in (*_interpreter_under(hidden), *cfg.read_paths):
        args += ["--ro-bind", p, p]
    args += ["--bind", str(scratch), str(scratch), "--chdir", str(scratch)]
    args += ["--unshare-all", "--die-with-parent", "--new-session"]
    return args


def _preexec(cfg: SandboxConfig, group: Cgroup | None) -> Callable[[], None]:
    mib = 1024 * 1024
    limits = [
        (resource.RLIMIT_CPU, cfg.cpu_s, cfg.cpu_s + 1),
        (resource.RLIMIT_AS, cfg.memory_mb * mib, cfg.memory_mb * mib),
        (resource.RLIMIT_NPROC, cfg.max_procs, cfg.max_procs),
        (resource.RLIMIT_FSIZE, cfg.max_file_mb * mib, cfg.max_file_mb * mib),
        (resource.RLIMIT_NOFILE, cfg.max_open_files, cfg.max_open_files),
    ]

    def apply() -> None:
        # The cgroup first: entering it opens a file, which RLIMIT_NOFILE would forbid in a
        # parent holding more descriptors than the limit (they are closed only after this).
        if group is not None:
            group.enter()
        for which, soft, hard in limits:
            resource.setrlimit(which, (soft, hard))

    return apply


def _env(scratch: Path) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(scratch),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
    }


async def _run(argv: list[str], scratch: Path, cfg: SandboxConfig, stdin: str) -> SandboxResult:
    group = Cgroup.create(cfg.max_procs, cfg.memory_mb * 1024 * 1024)
    try:
        return await _run_in(argv, scratch, cfg, stdin, group)
    finally:
        if group is not None:
            for _ in range(500):  # killed tasks leave the group within milliseconds
                group.kill()
                if group.remove():
                    break
                await asyncio.sleep(0.01)


async def _run_in(
    argv: list[str], scratch: Path, cfg: SandboxConfig, stdin: str, group: Cgroup | None
) -> SandboxResult:
    start = time.monotonic()
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=scratch,
            env=_env(scratch),
            preexec_fn=_preexec(cfg, group),
            start_new_session=True,
        )
    except OSError as exc:
        raise SandboxError(f"cannot start sandbox {argv[0]}: {exc}") from exc

    def kill() -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if group is not None:
            group.kill()

    overflow: list[str] = []
    out, err = bytearray(), bytearray()

    async def pump(stream: asyncio.StreamReader, buf: bytearray, name: str) -> None:
        # Keep draining after an overflow so the pipe reaches EOF and the transport closes.
        while chunk := await stream.read(_CHUNK):
            room = cfg.max_output_bytes - len(buf)
            buf += chunk[: max(room, 0)]
            if len(chunk) > room and name not in overflow:
                overflow.append(name)
                kill()

    async def feed() -> None:
        assert proc.stdin is not None
        try:
            if stdin:
                proc.stdin.write(stdin.encode("utf-8"))
                await proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            proc.stdin.close()

    assert proc.stdout is not None and proc.stderr is not None
    tasks = [
        asyncio.ensure_future(pump(proc.stdout, out, "stdout")),
        asyncio.ensure_future(pump(proc.stderr, err, "stderr")),
        asyncio.ensure_future(feed()),
    ]
    timed_out = False
    try:
        await asyncio.wait_for(asyncio.gather(*tasks, proc.wait()), cfg.timeout_s)
    except asyncio.TimeoutError:
        timed_out = True
    finally:
        kill()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        try:
            await asyncio.wait_for(proc.wait(), 5)
        except asyncio.TimeoutError:  # pragma: no cover - unkillable child
            pass
    seconds = time.monotonic() - start
    stdout = out.decode("utf-8", errors="replace")
    stderr = err.decode("utf-8", errors="replace")
    oom = group is not None and group.oom_killed()
    status, reason = _classify(proc.returncode, stderr, cfg, seconds, timed_out, overflow, oom)
    return SandboxResult(status, proc.returncode, stdout, stderr, seconds, reason)


def _signal_of(rc: int | None, cfg: SandboxConfig) -> int | None:
    """Return the signal that ended the code (bwrap reports it as 128 + n)."""
    if rc is None:
        return None
    if rc < 0:
        return -rc
    if cfg.mode == "bwrap" and rc > 128:
        return rc - 128
    return None


def _classify(
    rc: int | None,
    stderr: str,
    cfg: SandboxConfig,
    seconds: float,
    timed_out: bool,
    overflow: list[str],
    oom: bool = False,
) -> tuple[SandboxStatus, str | None]:
    if overflow:
        return "output_limit", f"{overflow[0]} exceeded {cfg.max_output_bytes} bytes"
    if oom:  # the group's limit killed a process: that was the binding limit, even if it hung on
        return "memory", f"memory limit {cfg.memory_mb} MiB exceeded (all processes together)"
    if timed_out:
        return "timeout", f"wall clock exceeded {cfg.timeout_s:g}s"
    if any(m in stderr for m in _MEMORY_MARKERS):
        return "memory", f"memory limit {cfg.memory_mb} MiB exceeded"
    sig = _signal_of(rc, cfg)
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and seconds >= cfg.cpu_s):
        return "timeout", f"cpu limit {cfg.cpu_s}s exceeded"
    if sig is not None:
        name = signal.Signals(sig).name if sig in _SIGNALS else str(sig)
        return "killed", f"killed by signal {name}"
    if rc != 0:
        lines = [line for line in stderr.splitlines() if line.strip()]
        return "error", lines[-1].strip() if lines else f"exit code {rc}"
    return "ok", None


_SIGNALS = {s.value for s in signal.Signals}
