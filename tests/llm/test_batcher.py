"""The batcher gathers concurrent callers into few calls and never leaves a caller hanging."""

from __future__ import annotations

import asyncio

import pytest

from evoagent.errors import BackendError
from evoagent.llm.batcher import Batcher


def test_concurrent_requests_share_calls_and_keep_their_order():
    b: Batcher[int, int] = Batcher(lambda xs: [x * 10 for x in xs], 8, 20, "test")

    async def main():
        return await asyncio.gather(*(b.submit([i, i + 100]) for i in range(6)))

    out = asyncio.run(main())
    assert out == [[i * 10, (i + 100) * 10] for i in range(6)]
    assert b.calls <= 3 and b.largest == 8


def test_a_wrong_number_of_results_fails_the_callers_instead_of_hanging():
    b: Batcher[int, int] = Batcher(lambda xs: xs[:-1], max_batch=4, wait_ms=0, name="test")

    async def main():
        return await asyncio.wait_for(b.submit([1, 2, 3]), 5)

    with pytest.raises(BackendError, match="returned 2 results for 3 requests"):
        asyncio.run(main())


def test_a_failed_call_fails_only_its_batch_as_a_backend_error_and_a_new_loop_starts_clean():
    calls = []

    def fn(xs):
        calls.append(list(xs))
        if -1 in xs:
            raise RuntimeError("model fell over")
        return xs

    b: Batcher[int, int] = Batcher(fn, max_batch=4, wait_ms=0, name="test")
    with pytest.raises(BackendError, match="test backend failed: RuntimeError: model fell over"):
        asyncio.run(b.submit([-1]))
    assert asyncio.run(b.submit([5, 6])) == [5, 6]  # second asyncio.run: a fresh worker
    assert calls[-1] == [5, 6]
