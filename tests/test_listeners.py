"""The fan-out every change goes through (``daemon.listeners``): a listener that raises is
logged on its owner's logger and the ones after it still hear of the change."""

from __future__ import annotations

import asyncio
import logging

import pytest

from daemon.listeners import Listeners

log = logging.getLogger("test.listeners")


def test_a_failing_listener_is_logged_and_the_rest_still_called(
        caplog: pytest.LogCaptureFixture) -> None:
    heard: list[str] = []
    listeners: Listeners[[str]] = Listeners(log, "a listener failed")

    def broken(value: str) -> None:
        raise RuntimeError("boom")

    listeners.add(heard.append)
    listeners.add(broken)
    listeners.add(lambda value: heard.append(value.upper()))
    with caplog.at_level(logging.ERROR, "test.listeners"):
        listeners("x")
    assert heard == ["x", "X"]
    [record] = caplog.records
    assert record.name == "test.listeners"
    assert record.getMessage() == "a listener failed"
    assert record.exc_info is not None and "boom" in str(record.exc_info[1])


def test_log_args_puts_the_arguments_in_the_line(caplog: pytest.LogCaptureFixture) -> None:
    listeners: Listeners[[dict[str, str]]] = Listeners(log, "failed on %s", log_args=True)
    listeners.add(lambda ev: 1 / 0)
    with caplog.at_level(logging.ERROR, "test.listeners"):
        listeners({"event": "queued"})
    assert [r.getMessage() for r in caplog.records] == ["failed on {'event': 'queued'}"]


def test_notify_awaits_coroutine_listeners_and_logs_their_failures(
        caplog: pytest.LogCaptureFixture) -> None:
    heard: list[int] = []
    listeners: Listeners[[int]] = Listeners(log, "a listener failed")

    async def later(value: int) -> None:
        await asyncio.sleep(0)
        heard.append(value * 10)

    async def broken(value: int) -> None:
        await asyncio.sleep(0)
        raise RuntimeError("boom")

    listeners.add(later)
    listeners.add(broken)
    listeners.add(heard.append)
    with caplog.at_level(logging.ERROR, "test.listeners"):
        asyncio.run(listeners.notify(2))
    assert heard == [20, 2]
    assert [r.getMessage() for r in caplog.records] == ["a listener failed"]
