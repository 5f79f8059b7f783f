"""A throwaway control group that bounds a sandboxed run as a whole: process count and memory.

rlimits are per process, and ``RLIMIT_NPROC`` does not bind root at all, so a fork bomb or
many processes of 512 MiB each slip past them. A cgroup counts every process the sandbox
spawns: ``pids.max`` makes ``fork`` fail once the sandbox holds that many tasks, and the memory
limit OOM-kills the sandbox, not the host. It also finds every process at the end, even one
that left the process group (``setsid``) or ignores SIGTERM.

Works with cgroup v2 (one unified hierarchy) and v1 (``pids`` and ``memory`` hierarchies) where
this process may create groups (root, or a delegated subtree); elsewhere ``Cgroup.create``
returns None and the sandbox falls back to rlimits, the pid namespace and the timeout.
"""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")


class Cgroup:
    """One sandbox's group(s); ``enter`` runs in the child, ``kill``/``remove`` in the parent."""

    def __init__(self, dirs: list[Path], memory_file: Path | None, events: Path | None) -> None:
        self.dirs = dirs
        self._memory_file = memory_file
        self._events = events

    @classmethod
    def create(cls, max_procs: int, memory_bytes: int, root: Path = ROOT) -> Cgroup | None:
        """A new group limited to ``max_procs`` tasks and ``memory_bytes``, or None if unsupported."""
        name = f"evoagent-{uuid.uuid4().hex[:12]}"
        made: list[Path] = []
        try:
            unified = root / "cgroup.controllers"
            if unified.is_file():  # cgroup v2
                if not {"pids", "memory"} <= set(unified.read_text().split()):
                    return None
                d = root / name
                d.mkdir()
                made.append(d)
                (d / "pids.max").write_text(str(max_procs))
                (d / "memory.max").write_text(str(memory_bytes))
                (d / "memory.swap.max").write_text("0")
                return cls(made, d / "memory.events", d / "memory.events")
            pids, memory = root / "pids", root / "memory"
            if not (pids / "cgroup.procs").is_file():
                return None
            d = pids / name
            d.mkdir()
            made.append(d)
            (d / "pids.max").write_text(str(max_procs))
            mem_file = None
            if (memory / "cgroup.procs").is_file():
                m = memory / name
                m.mkdir()
                made.append(m)
                (m / "memory.limit_in_bytes").write_text(str(memory_bytes))
                mem_file = m / "memory.oom_control"
            return cls(made, mem_file, mem_file)
        except OSError:
            for d in reversed(made):
                _rmdir(d)
            return None

    def enter(self) -> None:
        """Move the calling process (the sandbox child, before exec) into the group."""
        pid = str(os.getpid())
        for d in self.dirs:
            (d / "cgroup.procs").write_text(pid)

    def oom_killed(self) -> bool:
        """Whether the memory limit killed a process of the group."""
        if self._events is None:
            return False
        try:
            fields = dict(line.split() for line in self._events.read_text().splitlines() if " " in line)
        except OSError:
            return False
        return int(fields.get("oom_kill", "0")) > 0

    def kill(self) -> None:
        """SIGKILL every process still in the group, wherever its process group or session."""
        for d in self.dirs:
            try:
                pids = (d / "cgroup.procs").read_text().split()
            except OSError:
                continue
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass

    def remove(self) -> bool:
        """Remove the group's folders; False while killed processes are still exiting."""
        return all(_rmdir(d) for d in self.dirs)


def _rmdir(d: Path) -> bool:
    try:
        d.rmdir()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True
