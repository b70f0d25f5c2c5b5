"""``POST /tts/batch``: many utterances as one ZIP of WAVs, streamed entry by entry."""

from __future__ import annotations

import contextlib
import logging
import re
import time
import zipfile
from dataclasses import replace
from pathlib import PurePosixPath

from aiohttp import hdrs, web

from tts import wav_bytes

from ...metrics import Timeline
from ...request import (
    RequestError,
    parse_json,
)
from .fields import (
    SPEECH_FIELDS,
    ApiError,
    Speech,
    decode_utf8,
    kind_of,
    string_field,
)
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
    with contextlib.suppress(ConnectionError):  # the client went away: its job stopped
        with zipfile.ZipFile(sink, "w", zipfile.ZIP_STORED) as zf:
            for speech in items:
                # one job at a time: a batch takes one of HTTP's slots, as one request does
                job = api.submit(speech, Timeline(received=received))
                try:
                    pcm = await api.synthesize_all(job)
                except RequestError as e:
                    if e.code != "nothing-to-say":
                        raise
                    log.warning("HTTP batch item %s has nothing to pronounce; it gets an "
                                "empty WAV", speech.filename)
                    pcm = b""
                info = zipfile.ZipInfo(speech.filename, time.localtime()[:6])
                zf.writestr(info, wav_bytes(pcm, api.ctx.engine.audio_format(speech.voice)))
                await resp.write(sink.drain())
        await resp.write(sink.drain())  # the central directory
        await resp.write_eof()
    return resp


async def batch_items(api: SpeechApi, request: web.Request) -> list[Speech]:
    ctype = request.content_type if hdrs.CONTENT_TYPE in request.headers else ""
    if ctype not in ("", "application/json") and not ctype.endswith("+json"):
        raise ApiError(415, f"/tts/batch takes a JSON body, not {ctype!r}")
    body = parse_json(decode_utf8(await request.read(), "request body"))
    items = body.get("items") if isinstance(body, dict) else body
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
        speech = await api.speech(item, where, SPEECH_FIELDS | {"filename"})
        name = unique_filename(string_field(item, "filename", where), i, taken)
        out.append(replace(speech, filename=name))
    return out


class ZipSink:
    """A write-only, unseekable file for ``zipfile``: the handler drains it after each entry,
    so a batch holds one WAV in memory at a time, not fifty."""

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


def unique_filename(raw: str | None, index: int, taken: set[str]) -> str:
    """A safe ``NAME.wav`` for a ZIP entry: no directories, no odd characters, no repeats."""
    base = PurePosixPath((raw or "").replace("\\", "/")).name
    if base.lower().endswith(".wav"):
        base = base[:-4]
    stem = _UNSAFE_FILENAME.sub("_", base).strip("._-")[:80] or f"{index + 1:03d}"
    name, n = f"{stem}.wav", 2
    while name.lower() in taken:
        name, n = f"{stem}-{n}.wav", n + 1
    taken.add(name.lower())
    return name
