"""Which request a log line is about, without every call site saying so.

A front sets ``request_context(id)`` where a request's life starts (the scheduler for queued
work, the Wyoming and HTTP fronts for what they serve themselves); every log record made
inside it, in that task or in tasks it starts, carries ``request_id``, which the journal
handler (``daemon.systemd``) turns into the ``HERALD_REQUEST_ID`` field:
``journalctl -u herald HERALD_REQUEST_ID=<id>``.

asyncio copies the context into each task it creates; a plain thread starts with an empty
one, so code that hands work to a thread must carry the context over (``contextvars.
copy_context().run``) for its lines to carry the id.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from contextvars import Context, ContextVar, copy_context

current_request: ContextVar[str | None] = ContextVar("herald_request_id", default=None)


@contextlib.contextmanager
def request_context(request_id: str | None) -> Iterator[None]:
    """Log lines made inside are about ``request_id``."""
    token = current_request.set(request_id)
    try:
        yield
    finally:
        current_request.reset(token)


class RequestIdFilter(logging.Filter):
    """Sets ``record.request_id`` from the context, unless the call passed one itself."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.__dict__.get("request_id") is None:
            request_id = current_request.get()
            if request_id is not None:
                record.request_id = request_id
        return True


def context_for(request_id: str) -> Context:
    """A copy of the current context in which log lines are about ``request_id``: give it to
    ``asyncio.create_task(..., context=...)`` for a task that works on one request."""
    ctx = copy_context()
    ctx.run(current_request.set, request_id)
    return ctx
