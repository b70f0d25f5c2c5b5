"""``POST /tts/batch``: many utterances as one ZIP, streamed entry by entry.

Each entry is in its item's ``response_format`` (default: the batch's, from the query or the
``{"items": [...], "response_format": ...}`` form; WAV without one). Items are synthesized
side by side, as many at once as the engine has workers (more would only take turns on
them), and go into the ZIP in the order they were asked for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
import zipfile
from collections import deque
from collections.abc import AsyncGenerator
from dataclasses import replace
from pathlib import PurePosixPath

from aiohttp import hdrs, web

from tts.codec import EXTENSIONS

from ...errors import RequestError
from ...jobs.fields import kind_of, parse_json
from ...jobs.metrics import Timeline
from .fields import SPEECH_FIELDS, ApiError, Speech, decode_utf8, string_field
from .formats import encode_whole, response_format_field
from .speech import SpeechApi

log = logging.getLogger("daemon.fronts.http")


_UNSAFE_FILENAME = re.compile(r"[^\w.-]+")


async def batch(api: SpeechApi, request: web.Request) -> web.StreamResponse:
    """A ZIP streamed entry by entry: every item is checked before the first byte."""
    received = time.monotonic()
    items = await batch_items(api, request)
    resp = web.StreamResponse(headers={
        hdrs.CONTENT_TYPE: "application/zip", hdrs.CACHE_CONTROL: "no-store",
        hdrs.CONTENT_DISPOSITION: 'attachment; filename="herald.zip"'})
    await resp.prepare(request)
    sink = ZipSink()
    with contextlib.suppress(ConnectionError):  # the client went away: its jobs stopped
        with zipfile.ZipFile(sink, "w", zipfile.ZIP_STORED) as zf:
            async with contextlib.aclosing(in_order(api, items, received)) as done:
                async for speech, data in done:
                    info = zipfile.ZipInfo(speech.filename, time.localtime()[:6])
                    zf.writestr(info, data)
                    await resp.write(sink.drain())
        await resp.write(sink.drain())  # the central directory
        await resp.write_eof()
    return resp


async def in_order(api: SpeechApi, items: list[Speech], received: float
                   ) -> AsyncGenerator[tuple[Speech, bytes], None]:
    """Each item with its encoded audio, in the order given, while the next ones are
    synthesized: as many at once as the engine has workers (and HTTP's share allows)."""
    window = max(1, min(api.ctx.engine.workers, api.settings.max_concurrent))
    running: deque[tuple[Speech, asyncio.Task[bytes]]] = deque()
    todo = iter(items)
    try:
        while True:
            while len(running) < window and (speech := next(todo, None)) is not None:
                running.append((speech, asyncio.create_task(
                    item_audio(api, speech, received))))
            if not running:
                return
            speech, task = running.popleft()
            yield speech, await task
    finally:  # the client went away, or an item failed: the rest is not wanted
        for _, task in running:
            task.cancel()
        await asyncio.gather(*(task for _, task in running), return_exceptions=True)


async def item_audio(api: SpeechApi, speech: Speech, received: float) -> bytes:
    """One item's audio, encoded as it asked (its job files its latency record)."""
    job = api.submit(speech, Timeline(received=received), whole=True)
    try:
        pcm = await api.synthesize_all(job)
    except RequestError as e:
        if e.code != "nothing-to-say":
            raise
        log.warning("HTTP batch item %s has nothing to pronounce; it gets no audio",
                    speech.filename)
        pcm = b""
    return await encode_whole(speech.response_format,
                              api.ctx.engine.audio_format(speech.voice), pcm)


async def batch_items(api: SpeechApi, request: web.Request) -> list[Speech]:
    ctype = request.content_type if hdrs.CONTENT_TYPE in request.headers else ""
    if ctype not in ("", "application/json") and not ctype.endswith("+json"):
        raise ApiError(415, f"/tts/batch takes a JSON body, not {ctype!r}")
    body = parse_json(decode_utf8(await request.read(), "request body"))
    items = body.get("items") if isinstance(body, dict) else body
    # The batch's default format: the query's, below the body's.
    defaults = {k: v for k, v in [*request.query.items(), *(
        body.items() if isinstance(body, dict) else ())] if k == "response_format"}
    default = response_format_field(defaults, "wav")
    if not isinstance(items, list):
        raise ApiError(400, 'send a JSON list [{"text": ..., "voice": ..., "filename": '
                       '...}, ...] (or {"items": [...]})')
    if not items:
        raise ApiError(400, "the batch is empty: nothing to speak")
    if len(items) > api.settings.max_batch:
        raise ApiError(413, f"the batch has {len(items)} items; the limit is "
                       f"{api.settings.max_batch} (http.max_batch): send several batches")
    taken: set[str] = set()
    out = []
    for i, item in enumerate(items):
        where = f"item {i}: "
        if not isinstance(item, dict):
            raise ApiError(400, f"{where}must be an object like {{\"text\": \"Hello\"}}, "
                           f"not {kind_of(item)}")
        speech = await api.speech({"response_format": default, **item}, where,
                                  SPEECH_FIELDS | {"filename"})
        name = unique_filename(string_field(item, "filename", where), i, taken,
                               EXTENSIONS[speech.response_format])
        out.append(replace(speech, filename=name))
    return out


class ZipSink:
    """A write-only, unseekable file for ``zipfile``: the handler drains it after each entry,
    so a batch holds the few entries being made in memory, not fifty."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._pos = 0

    def write(self, data: bytes) -> int:
        self._parts.append(bytes(data))
        self._pos += len(data)
        return len(data)

    def tell(self) -> int:
        return self._pos

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass

    def drain(self) -> bytes:
        data = b"".join(self._parts)
        self._parts.clear()
        return data


def unique_filename(raw: str | None, index: int, taken: set[str], ext: str = ".wav") -> str:
    """A safe ``NAME.ext`` for a ZIP entry: no directories, no odd characters, no repeats."""
    base = PurePosixPath((raw or "").replace("\\", "/")).name
    if base.lower().endswith(ext):
        base = base[:-len(ext)]
    stem = _UNSAFE_FILENAME.sub("_", base).strip("._-")[:80] or f"{index + 1:03d}"
    name, n = f"{stem}{ext}", 2
    while name.lower() in taken:
        name, n = f"{stem}-{n}{ext}", n + 1
    taken.add(name.lower())
    return name
