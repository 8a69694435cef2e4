"""Shutting a background task down must not hang when a client library swallows the cancellation.

redis-py's cluster client can turn a ``CancelledError`` that lands in the same instant as its read
timeout into a timeout it retries: a single ``cancel()`` is then lost, and a router's ``close()``
that awaited its results listener hung for ever (seen as a CI run that never finished)."""

from __future__ import annotations

import asyncio

from argusdiff.service.dispatch import stop_task


def test_a_task_that_swallows_its_first_cancellations_still_stops():
    async def main():
        swallowed = 0

        async def stubborn():
            nonlocal swallowed
            while True:
                try:
                    await asyncio.sleep(10)
                except asyncio.CancelledError:
                    swallowed += 1
                    if swallowed >= 3:
                        raise
                    asyncio.current_task().uncancel()  # what a retrying client does to it

        task = asyncio.create_task(stubborn())
        await asyncio.sleep(0)
        await stop_task(task, timeout_s=30)
        assert task.done() and task.cancelled() and swallowed == 3

    asyncio.run(main())


def test_a_task_that_never_stops_is_left_behind_after_the_wait():
    async def main():
        release = False

        async def immortal():
            while True:
                try:
                    await asyncio.sleep(10)
                except asyncio.CancelledError:
                    if release:
                        raise
                    asyncio.current_task().uncancel()

        task = asyncio.create_task(immortal())
        await asyncio.sleep(0)
        await stop_task(task, timeout_s=0.3)
        assert not task.done()  # the shutdown goes on without it instead of waiting for ever
        release = True
        await stop_task(task)
        assert task.cancelled()

    asyncio.run(main())


def test_stop_task_accepts_none_and_finished_tasks():
    async def main():
        await stop_task(None)
        task = asyncio.create_task(asyncio.sleep(0))
        await task
        await stop_task(task)

    asyncio.run(main())
