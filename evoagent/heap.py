"""Give freed memory back to the operating system after a large, short-lived allocation.

A training step or the prefill of a long batch allocates gigabytes of temporary tensors; once
freed, glibc keeps most of them in its arenas, so the process's resident size stays at its
peak for the rest of the run (measured: 9.5 GB retained after one RL step that needed 1.6 GB).
``malloc_trim(0)`` returns those pages. Elsewhere (musl, macOS) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import cache


@cache
def _trim() -> object | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


def release_memory() -> None:
    """Return free heap pages to the OS (cheap: about a millisecond)."""
    trim = _trim()
    if trim is not None:
        trim(0)  # type: ignore[operator]
