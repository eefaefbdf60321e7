"""rollup.in_daemon_thread: a rollup runs off the event loop, and a stuck one never holds the exit."""

from __future__ import annotations

import asyncio
import threading

import pytest

from stitchfleet.operator.rollup import in_daemon_thread

pytestmark = [pytest.mark.timeout(30), pytest.mark.asyncio]


async def test_the_result_and_the_thread() -> None:
    def work() -> tuple[str, bool]:
        current = threading.current_thread()
        return current.name, current.daemon

    assert await in_daemon_thread(work) == ("stitchfleet-rollup", True)


async def test_an_error_reaches_the_awaiting_task() -> None:
    def work() -> int:
        raise ConnectionError("database away")

    with pytest.raises(ConnectionError, match="database away"):
        await in_daemon_thread(work)


async def test_cancelling_abandons_a_stuck_rollup_at_once() -> None:
    release = threading.Event()
    task = asyncio.create_task(in_daemon_thread(lambda: release.wait(30)))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 2)
    stuck = [thread for thread in threading.enumerate() if thread.name == "stitchfleet-rollup"]
    assert stuck and all(thread.daemon for thread in stuck), "left to the interpreter, which does not wait"
    release.set()  # the abandoned thread ends; its late answer goes nowhere
    for thread in stuck:
        thread.join(5)
    await asyncio.sleep(0.05)
