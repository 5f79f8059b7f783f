"""Gather requests from many concurrent coroutines into few large model calls.

The executor runs dozens of agent executions at once, each awaiting one completion at a time.
Batches of 32-64 prompts generate several times faster than single prompts on a CPU
(bench/backend_throughput.py: hf_vs_sequential), so every request goes through one
``Batcher``: a single worker waits up to ``wait_ms`` for company (or until ``max_batch``
requests are queued), runs the blocking model call in its own thread so the event loop keeps
queueing, then resolves each caller's future. Whatever arrives while the model is busy forms
the next batch. The thread is the batcher's alone, not the pool ``asyncio.to_thread`` shares:
environment steps or rewards waiting there never hold up the model.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar

from evoagent.errors import BackendError

Req = TypeVar("Req")
Res = TypeVar("Res")


class Batcher(Generic[Req, Res]):
    """Serialises calls of ``fn(batch) -> results`` (aligned lists) and batches their inputs.

    Any failure of ``fn`` is the model's, not the agent's: its callers get it as a
    ``BackendError`` naming the backend, so the executor does not mistake it for one input's
    bad luck.
    """

    def __init__(
        self, fn: Callable[[list[Req]], list[Res]], max_batch: int, wait_ms: float, name: str
    ):
        self._fn = fn
        self._name = name
        self._max = max_batch
        self._wait = wait_ms / 1000.0
        self._queue: list[tuple[Req, asyncio.Future[Res]]] = []
        self._wake: asyncio.Event | None = None
        self._worker: asyncio.Task[None] | None = None
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="evoagent-model")
        self.calls = 0
        self.largest = 0

    async def submit(self, requests: Sequence[Req]) -> list[Res]:
        """Queue ``requests`` and return their results in order once served."""
        loop = asyncio.get_running_loop()
        if self._worker is None or self._worker.done() or self._worker.get_loop() is not loop:
            # A new event loop (a second asyncio.run): what was queued on the old one can never
            # be answered there, so it is dropped rather than served into dead futures.
            self._queue = [(r, f) for r, f in self._queue if f.get_loop() is loop]
            self._wake = asyncio.Event()
            self._worker = loop.create_task(self._run())
        futures = [loop.create_future() for _ in requests]
        self._queue.extend(zip(requests, futures))
        assert self._wake is not None
        self._wake.set()
        return list(await asyncio.gather(*futures))

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            if len(self._queue) < self._max and self._wait > 0:
                await asyncio.sleep(self._wait)
            while self._queue:
                batch, self._queue = self._queue[: self._max], self._queue[self._max :]
                live = [(r, f) for r, f in batch if not f.done()]
                if not live:
                    continue
                self.calls += 1
                self.largest = max(self.largest, len(live))
                try:
                    loop = asyncio.get_running_loop()
                    results = await loop.run_in_executor(self._thread, self._fn, [r for r, _ in live])
                    if len(results) != len(live):
                        raise BackendError(
                            f"the model call returned {len(results)} results for {len(live)} requests"
                        )
                except BaseException as e:  # a failed model call fails its callers, not the loop
                    err = e
                    if isinstance(e, Exception) and not isinstance(e, BackendError):
                        err = BackendError(f"{self._name} backend failed: {type(e).__name__}: {e}")
                    for _, f in live:
                        if not f.done():
                            f.set_exception(err)
                    if not isinstance(e, Exception):
                        raise
                    continue
                for (_, f), res in zip(live, results, strict=True):
                    if not f.done():
                        f.set_result(res)

    async def aclose(self) -> None:
        if self._worker is not None and not self._worker.done():
            self._worker.cancel()
            try:
                await self._worker
            except (asyncio.CancelledError, RuntimeError):
                pass
        self._worker = None
