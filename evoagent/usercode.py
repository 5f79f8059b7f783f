"""Run the user's synchronous code (a ``python`` reward, a ``module:function`` tool, a plug-in
mutation operator) in a worker process that is killed when its time is up.

A thread cannot be stopped: a user function that hangs inside ``asyncio.to_thread`` keeps its
thread for good, and the pool every ``to_thread`` shares fills up until the run can neither go
on nor exit. A process can be killed. Workers come from a ``forkserver`` (a clean interpreter
with evoagent's data types preloaded, not a fork of this process and its model threads), are
kept for the next call, and one whose call times out is killed (SIGKILL) and replaced on the
next call. The function and its arguments cross by pickle: the worker imports the function's
module itself, with this process's current ``sys.path``.

A caller may wrap the call (``wrap``, a module-level function run in the worker in place of
``fn(*args)``) and answer the worker's questions (``ask`` in the worker, ``answer`` here) over
the pipe: the mutation operators use this to give an operator ``ctx.history()`` and to bring its
draws from ``ctx.rng`` back (``evoagent.evolve.operators``). Modules a caller's workers need
go on the forkserver's preload list (``preload``), so no call's time limit pays for an import.

Not covered: this is no sandbox. User code runs with the run's own permissions and memory
(generated code goes through the ``python`` tool's bubblewrap sandbox instead).
"""

from __future__ import annotations

import asyncio
import inspect
import multiprocessing as mp
import pickle
import signal
import sys
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

from evoagent.errors import EvoagentError, UserCodeError

_PRELOAD = ["evoagent.usercode", "evoagent.tasks.datasets", "evoagent.graph.model"]
_CTX = mp.get_context("forkserver")
_CTX.set_forkserver_preload(_PRELOAD)
Wrap = Callable[[Callable[..., Any], Sequence[Any], Callable[[], Any]], Any]  # (fn, args, ask) -> result


def preload(module: str) -> None:
    """Have every worker import ``module`` before its first call (once the forkserver starts,
    which is at the first call of the process: call this at import time)."""
    if module not in _PRELOAD:
        _PRELOAD.append(module)
        _CTX.set_forkserver_preload(_PRELOAD)


class UserCode:
    """A small pool of worker processes for the user's synchronous functions.

    ``workers`` calls run at once; the others wait for a free worker. A call's timeout counts
    from the moment its worker has it. Processes start on first use; ``aclose`` stops them.
    One pool may serve one event loop after another (a script's successive ``asyncio.run``s).
    """

    def __init__(self, workers: int = 2) -> None:
        self.workers = workers
        self._idle: list[_Worker] = []
        self._slots: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop ``_slots`` belongs to
        self.killed = 0

    async def call(
        self, fn: Callable[..., Any], args: Sequence[Any], timeout_s: float | None, what: str,
        wrap: Wrap | None = None, answer: Callable[[], Any] | None = None,
    ) -> Any:
        """``fn(*args)`` in a worker; raises ``UserCodeError`` naming ``what`` when it raised,
        hung past ``timeout_s`` (the worker is killed), died, or cannot cross the pipe; an
        ``EvoagentError`` it raised (``MutationError``: the operator does not apply) is
        raised here as is.
        A cancelled call kills its worker too. ``wrap(fn, args, ask)`` runs in the worker
        instead of ``fn(*args)``; each ``ask()`` there is answered by ``answer()`` here."""
        try:
            payload = pickle.dumps((list(sys.path), fn, tuple(args), wrap))
        except Exception as e:  # a lambda or a closure: it cannot reach another process
            raise UserCodeError(f"{what} cannot run in a worker process: {type(e).__name__}: {e}") from None
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a semaphore serves one event loop; the worker processes serve any
            self._slots, self._loop = asyncio.Semaphore(self.workers), loop
        assert self._slots is not None
        async with self._slots:
            worker = self._idle.pop() if self._idle else await _start()
            ok = False
            try:
                result = await asyncio.wait_for(worker.call(payload, what, answer), timeout_s)
                ok = True
                return result
            except TimeoutError:
                raise UserCodeError(f"{what} timed out after {timeout_s:g}s (its process was killed)") from None
            finally:  # a call that did not finish (timed out, cancelled) leaves a busy worker
                if ok or worker.clean:
                    self._idle.append(worker)
                else:
                    self.killed += 1
                    worker.kill()

    async def aclose(self) -> None:
        """Stop every idle worker (a busy one is killed when its call ends or times out)."""
        for w in self._idle:
            w.kill()
        self._idle.clear()


class _Worker:
    """One worker process and its end of the pipe; serves one call at a time."""

    def __init__(self) -> None:
        self.conn, child = _CTX.Pipe(duplex=True)
        self.proc = _CTX.Process(target=_serve, args=(child,), daemon=True, name="evoagent-usercode")
        self.proc.start()
        child.close()
        self.clean = True  # false once a call ended without the worker answering

    async def call(self, payload: bytes, what: str, answer: Callable[[], Any] | None) -> Any:
        self.clean = False
        self.conn.send_bytes(payload)
        while True:
            await _readable(self.conn)
            try:
                kind, value = self.conn.recv()
            except (EOFError, OSError):
                self.proc.join(1)
                raise UserCodeError(f"{what}: its worker process died (exit code {self.proc.exitcode})") from None
            if kind == "ask":
                self.conn.send(answer() if answer is not None else None)
                continue
            self.clean = True
            if kind == "ok":
                return value
            if kind == "raise":
                raise value
            raise UserCodeError(f"{what} raised {value}")

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5)
        self.conn.close()


async def _start() -> _Worker:
    """A new worker (started in a thread: a process start blocks); if the caller is cancelled
    meanwhile, the worker is stopped once it is up rather than left behind."""
    task = asyncio.get_running_loop().run_in_executor(None, _Worker)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(lambda f: f.exception() is None and f.result().kill())
        raise


async def _readable(conn: Connection) -> None:
    """Wait until ``conn`` has data (or its other end closed) without holding a thread."""
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    fd = conn.fileno()
    loop.add_reader(fd, lambda: ready.done() or ready.set_result(None))
    try:
        await ready
    finally:
        loop.remove_reader(fd)


# -- in the worker process ----------------------------------------------------------------------

def _serve(conn: Connection) -> None:
    """Answer calls until the pipe closes. Ctrl-C is the parent's to handle."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    while True:
        try:
            payload = conn.recv_bytes()
        except (EOFError, OSError):
            return
        try:
            path, fn, args, wrap = pickle.loads(payload)
            if path != sys.path:
                sys.path[:] = path

            def ask() -> Any:
                conn.send(("ask", None))
                return conn.recv()

            out = wrap(fn, args, ask) if wrap is not None else settle(fn(*args))
            msg: tuple[str, Any] = ("ok", out)
        except EvoagentError as e:  # a MutationError says "does not apply": it keeps its type
            msg = ("raise", e)
        except BaseException as e:  # the user's failure is the answer, not the worker's end
            msg = ("error", f"{type(e).__name__}: {e}")
        try:
            conn.send(msg)
        except Exception as e:  # the result does not pickle
            conn.send(("error", f"a result that cannot be sent back ({type(e).__name__}: {e})"))


def settle(out: Any) -> Any:
    """``out``, or what it resolves to when a sync-looking function returned an awaitable."""
    return asyncio.run(_wait(out)) if inspect.isawaitable(out) else out


async def _wait(awaitable: Any) -> Any:
    return await awaitable


def _die_with_parent() -> None:
    """Ask Linux to kill this worker when the forkserver (its parent) exits."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
