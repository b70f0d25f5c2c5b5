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
import logging
import struct
import wave
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import RequestError
from ...jobs.fields import Fields, check_text, json_object
from ...jobs.request import Request, new_id
from ...jobs.scheduler import TERMINAL
from ...mqtt.payload import Limits, decode_text
from ...mqtt.topics import TopicError, Topics, check_request_id
from .extension import Extension, Front, Message, Route

log = logging.getLogger(__name__)


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
    # Of Hermes' fields only ``text`` is a request field; siteId, sessionId, lang and its id
    # are Hermes' own (read below), and Rhasspy's other fields are not ours to refuse.
    fields = Fields.read({"text": data.get("text")})
    text = check_text(fields.text, limits.max_text, "mqtt.max_text")
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


class Hermes(Extension):
    """``hermes/tts/say`` and the audio server's ``playBytes`` for our site, each answered
    once its request ends."""

    name = "hermes"

    def __init__(self, front: Front) -> None:
        super().__init__(front)
        self._site = front.settings.hermes.site_id
        self._replies: dict[str, tuple[str, str]] = {}  # request id -> reply (topic, payload)
        self._play_bytes: str | None = None

    def start(self) -> None:
        try:
            self._play_bytes = Topics.hermes_play_bytes(self._site)
        except TopicError as e:
            log.error("MQTT: Hermes playBytes is off: %s", e)

    def subscriptions(self) -> list[str]:
        return [Topics.HERMES_SAY] + ([self._play_bytes] if self._play_bytes else [])

    def route(self, topic: str) -> Route | None:
        if topic == Topics.HERMES_SAY:
            # retained_ok: the handler refuses a retained say for our site (and replies);
            # one for another site is not ours to report
            return Route(self._on_say, retained_ok=True)
        if self._play_bytes:
            play_id = Topics.hermes_play_bytes_id(topic, self._site)
            if play_id is not None:
                # retained_ok: a retained WAV is refused by the handler, which still replies
                return Route(lambda msg: self._on_play_bytes(play_id, msg), retained_ok=True)
        return None

    def on_event(self, ev: dict[str, Any]) -> None:
        if ev["event"] in TERMINAL:
            reply = self._replies.pop(ev["id"], None)
            if reply is not None:
                self.front.publish(*reply, 1, False)

    def _on_say(self, msg: Message) -> None:
        front = self.front
        if msg.retained and not msg.payload:
            return  # clears a retained say: nothing to refuse or answer
        say = parse_hermes_say(msg.payload, self._site, front.limits(), msg.timeline)
        if say is None:
            return
        if msg.retained:  # for our site: refused, and answered (the dialogue waits for it)
            front.refuse_retained(msg)
            front.publish(Topics.HERMES_SAY_FINISHED, say_finished(say), 1, False)
            return
        front.scheduler_for(say.request.id).submit(say.request)
        self._replies[say.request.id] = (Topics.HERMES_SAY_FINISHED, say_finished(say))

    def _on_play_bytes(self, hermes_id: str, msg: Message) -> None:
        """A WAV to play on the speaker, in the queue like speech. playFinished always
        follows, also for a WAV refused here: Rhasspy's dialogue waits for it."""
        front, topic = self.front, msg.topic
        reply = (Topics.hermes_play_finished(self._site), play_finished(hermes_id, self._site))
        if msg.retained:
            front.refuse_retained(msg)
            if msg.payload:  # an empty one clears a retained WAV: nothing to answer
                front.publish(*reply, 1, False)
            return
        try:
            play = parse_hermes_play(hermes_id, msg.payload, self._site, msg.timeline)
            req = play.request
            if req.id in front.seen:
                raise RequestError(f"duplicate request id {req.id!r}: already received, not "
                                   "played twice", req.id)
            front.scheduler_for(req.id).submit(req)
        except RequestError as e:
            front.error(topic, str(e), e.id, e.code)
            front.publish(*reply, 1, False)
            return
        except Exception as e:
            log.exception("MQTT: handling a message on %s failed", topic)
            front.error(topic, f"internal error: {e}", code="synthesis-failed")
            front.publish(*reply, 1, False)
            return
        front.seen.add(req.id)
        self._replies[req.id] = reply
