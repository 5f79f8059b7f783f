"""Run the user's synchronous code (a ``python`` reward, a ``module:function`` tool, a plug-in
mutation operator) in a worker process that is killed when its time is up.

A thread cannot be stopped: a user function that hangs inside ``asyncio.to_thread`` keeps its
thread for good, and the pool every ``to_thread`` shares fills up until the run can neither go
on nor exit. A process can be killed. Workers come from a ``forkserver`` (a clean interpreter
with evoagent's data types preloaded, not a fork of this process and its model threads), are
kept for the next call, and one whose call times out is killed (SIGKILL) and replaced on the
next call. The function and its arguments cross by pickle: the worker imports the function's
module itself, with this process's current ``sys.path``.

An operator gets its ``MutationContext`` in the worker without the mutator LLM (a sync
function could not await it anyway; make the operator ``async`` to use ``ctx.llm``);
``ctx.history()`` is answered by this process over the worker's pipe, and the operator's draws
from ``ctx.rng`` come back, so the slot's RNG continues as it would have in process.

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
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any

from evoagent.errors import EvoagentError, UserCodeError

_PRELOAD = ["evoagent.usercode", "evoagent.tasks.datasets", "evoagent.graph.model",
            "evoagent.evolve.operators"]
_CTX = mp.get_context("forkserver")
_CTX.set_forkserver_preload(_PRELOAD)


class UserCode:
    """A small pool of worker processes for the user's synchronous functions.

    ``workers`` calls run at once; the others wait for a free worker. A call's timeout counts
    from the moment its worker has it. Processes start on first use; ``aclose`` stops them.
    """

    def __init__(self, workers: int = 2) -> None:
        self.workers = workers
        self._idle: list[_Worker] = []
        self._slots: asyncio.Semaphore | None = None
        self.killed = 0

    async def call(
        self, fn: Callable[..., Any], args: Sequence[Any], timeout_s: float | None, what: str,
        history: Callable[[], Any] | None = None,
    ) -> Any:
        """``fn(*args)`` in a worker; raises ``UserCodeError`` naming ``what`` when it raised,
        hung past ``timeout_s`` (the worker is killed), died, or cannot cross the pipe; an
        ``EvoagentError`` it raised (``MutationError``: the operator does not apply) is
        raised here as is.
        A cancelled call kills its worker too. ``history`` answers an operator's
        ``ctx.history()`` (see the module docstring)."""
        try:
            payload = pickle.dumps((list(sys.path), fn, tuple(args)))
        except Exception as e:  # a lambda or a closure: it cannot reach another process
            raise UserCodeError(f"{what} cannot run in a worker process: {type(e).__name__}: {e}") from None
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.workers)
        async with self._slots:
            worker = self._idle.pop() if self._idle else await _start()
            ok = False
            try:
                result = await asyncio.wait_for(worker.call(payload, what, history), timeout_s)
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

    async def call(self, payload: bytes, what: str, history: Callable[[], Any] | None) -> Any:
        self.clean = False
        self.conn.send_bytes(payload)
        while True:
            await _readable(self.conn)
            try:
                kind, value = self.conn.recv()
            except (EOFError, OSError):
                self.proc.join(1)
                raise UserCodeError(f"{what}: its worker process died (exit code {self.proc.exitcode})") from None
            if kind == "history":
                self.conn.send(history() if history is not None else [])
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
            path, fn, args = pickle.loads(payload)
            if path != sys.path:
                sys.path[:] = path
            out = fn(*(_in_worker(a, conn) for a in args))
            if inspect.isawaitable(out):
                out = asyncio.run(_wait(out))
            msg: tuple[str, Any] = ("ok", _with_rng(out, args))
        except EvoagentError as e:  # a MutationError says "does not apply": it keeps its type
            msg = ("raise", e)
        except BaseException as e:  # the user's failure is the answer, not the worker's end
            msg = ("error", f"{type(e).__name__}: {e}")
        try:
            conn.send(msg)
        except Exception as e:  # the result does not pickle
            conn.send(("error", f"a result that cannot be sent back ({type(e).__name__}: {e})"))


async def _wait(awaitable: Any) -> Any:
    return await awaitable


def _in_worker(arg: Any, conn: Connection) -> Any:
    """A ``MutationContext`` becomes one whose ``history`` asks the parent; the rest as is."""
    from evoagent.evolve.operators import MutationContext

    if not isinstance(arg, MutationContext):
        return arg

    def history() -> Any:
        conn.send(("history", None))
        return conn.recv()

    return replace(arg, history=history)


def _with_rng(out: Any, args: Sequence[Any]) -> Any:
    """An operator's child graph plus the state its ``ctx.rng`` ended in."""
    from evoagent.evolve.operators import MutationContext

    ctx = next((a for a in args if isinstance(a, MutationContext)), None)
    return out if ctx is None else (out, ctx.rng.getstate())


def _die_with_parent() -> None:
    """Ask Linux to kill this worker when the forkserver (its parent) exits."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
