"""Hermes (Rhasspy / Snips) compatibility: ``hermes/tts/say`` in, ``hermes/tts/sayFinished``
out; and the audio server's ``hermes/audioServer/<siteId>/playBytes/<requestId>`` (a WAV
file) in, ``hermes/audioServer/<siteId>/playFinished`` out.

Only requests for our ``site_id`` are taken; the reply echoes the request's ``id`` and
``sessionId`` so a dialogue manager can continue the session. A dialogue manager waits for
the reply before it goes on, so every request we take gets one, also when it failed or was
stopped.
"""

from __future__ import annotations

import io
import json
import struct
import wave
from dataclasses import dataclass
from typing import Any

import numpy as np

from .request import (
    Limits,
    Request,
    RequestError,
    check_text,
    decode_text,
    json_object,
    new_id,
)
from .topics import TopicError, check_request_id


@dataclass(frozen=True)
class HermesSay:
    request: Request
    hermes_id: str | None
    session_id: str | None
    site_id: str


def parse_hermes_say(payload: bytes, site_id: str, limits: Limits,
                     timeline: Any = None) -> HermesSay | None:
    """The request in a ``hermes/tts/say`` payload; None when it is for another site."""
    data = json_object(decode_text(payload), '{"text": "...", "siteId": "..."}')
    if data.get("siteId", "default") != site_id:
        return None
    text = data.get("text")
    text = check_text(text if isinstance(text, str) else "", limits.max_text, "mqtt.max_text")
    hermes_id = data.get("id") if isinstance(data.get("id"), str) else None
    rid = new_id()
    if hermes_id:
        try:
            rid = check_request_id(hermes_id)
        except TopicError:
            pass
    lang = data.get("lang") if isinstance(data.get("lang"), str) else None
    voice = limits.resolve_voice(None) if not lang else _voice_for(lang, limits)
    req = Request(text=text, id=rid, voice=voice, sinks=limits.default_sinks, front="mqtt")
    if timeline is not None:
        req.timeline = timeline
    session = data.get("sessionId") if isinstance(data.get("sessionId"), str) else None
    return HermesSay(req, hermes_id, session, site_id)


def _voice_for(lang: str, limits: Limits) -> str:
    try:
        return limits.resolve_voice(lang)
    except Exception:
        return limits.resolve_voice(None)  # Rhasspy sends its own language; speak anyway


def say_finished(say: HermesSay) -> str:
    return json.dumps({"id": say.hermes_id, "sessionId": say.session_id, "siteId": say.site_id})


# --------------------------------------------------------------------------- playBytes

MAX_WAV_BYTES = 20 * 1024 * 1024  # about 7 minutes of 22 kHz mono: far more than a chime
_RATES = (4000, 192_000)  # sample rates a sound device can plausibly be asked for
_MAX_CHANNELS = 8


@dataclass(frozen=True)
class HermesPlay:
    request: Request
    hermes_id: str  # the topic's last level, echoed in playFinished
    site_id: str


def decode_wav(payload: bytes, max_bytes: int = MAX_WAV_BYTES) -> tuple[bytes, int]:
    """A WAV file as s16le mono PCM and its rate; several channels are averaged to one.

    Raises RequestError saying what is wrong (empty, too big, not a WAV, not 16-bit PCM)."""
    if not payload:
        raise RequestError("playBytes: empty payload: send a WAV file")
    if len(payload) > max_bytes:
        raise RequestError(f"playBytes: the WAV is {len(payload) / 1e6:.1f} MB; the limit is "
                           f"{max_bytes / 1e6:.0f} MB: send shorter audio")
    try:
        with wave.open(io.BytesIO(payload), "rb") as w:
            width, channels, rate = w.getsampwidth(), w.getnchannels(), w.getframerate()
            data = w.readframes(w.getnframes())
    except (wave.Error, EOFError, struct.error) as e:
        raise RequestError(f"playBytes: not a usable WAV file ({str(e) or 'truncated'}): send a "
                           "RIFF/WAVE file with 16-bit PCM") from None
    if width != 2:
        raise RequestError(f"playBytes: the WAV has {8 * width}-bit samples; herald plays "
                           "16-bit PCM WAV files")
    if not _RATES[0] <= rate <= _RATES[1]:
        raise RequestError(f"playBytes: the WAV's sample rate {rate} Hz is outside "
                           f"{_RATES[0]}..{_RATES[1]} Hz")
    if channels > _MAX_CHANNELS:
        raise RequestError(f"playBytes: the WAV has {channels} channels; at most "
                           f"{_MAX_CHANNELS} are mixed down")
    frame = width * channels
    data = data[: len(data) // frame * frame]  # a truncated file may end mid-frame
    if not data:
        raise RequestError("playBytes: the WAV holds no audio frames")
    if channels == 1:
        return data, rate
    frames = np.frombuffer(data, dtype="<i2").reshape(-1, channels)
    mono = np.rint(frames.astype(np.float32).mean(axis=1)).astype("<i2")
    return mono.tobytes(), rate


def parse_hermes_play(hermes_id: str, payload: bytes, site_id: str,
                      timeline: Any = None, max_bytes: int = MAX_WAV_BYTES) -> HermesPlay:
    """The request to play a ``playBytes`` WAV. The request id is Rhasspy's when it is
    usable as a herald id (events then carry it), a fresh one otherwise."""
    try:
        rid = check_request_id(hermes_id)
    except TopicError:
        rid = None
    try:
        pcm, rate = decode_wav(payload, max_bytes)
    except RequestError as e:
        raise RequestError(str(e), rid) from None
    req = Request(text="", id=rid or new_id(), sinks=("speaker",), front="mqtt", audio=pcm,
                  audio_rate=rate)
    if timeline is not None:
        req.timeline = timeline
    return HermesPlay(req, hermes_id, site_id)


def play_finished(hermes_id: str, site_id: str) -> str:
    return json.dumps({"id": hermes_id, "siteId": site_id, "sessionId": None})
