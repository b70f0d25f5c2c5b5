"""The MQTT front: commands in, events / status / latency / audio out.

paho runs its network loop in its own thread (``loop_start``). Its callbacks do nothing but
stamp the arrival time and hand the message to the asyncio loop with
``call_soon_threadsafe``; parsing, validation and queueing happen on the loop, and the
synthesis in the engine's threads, so the network thread never waits on anything.

The session is persistent (a fixed client id; MQTT 5 ``clean_start=False`` with a session
expiry, or MQTT 3.1.1 ``clean_session=False``), so QoS 1 requests sent while herald or the
broker was away are delivered when it comes back. paho reconnects with backoff; every
(re)connect resubscribes and republishes availability, status and discovery.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import ssl
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from tts import VoiceError

from ..context import Context
from ..discovery import discovery_payload
from ..hermes import parse_hermes_play, parse_hermes_say, play_finished, say_finished
from ..logcontext import request_context
from ..metrics import LatencyRecord, Timeline
from ..request import (
    Limits,
    Request,
    RequestError,
    decode_text,
    json_object,
    parse_json,
    parse_say,
    parse_stream_piece,
    stream_request,
)
from ..scheduler import TERMINAL, Scheduler
from ..settings import MqttSettings
from ..topics import (
    AVAILABILITY_OFFLINE,
    AVAILABILITY_ONLINE,
    TopicError,
    Topics,
    check_publish_topic,
)

log = logging.getLogger(__name__)

_STOP_TEXT_MAX = 256  # bytes: "PRESS", "stop", {"id": ...}
_REMEMBERED_IDS = 2000


@dataclass(eq=False)
class _Stream:
    """A say/stream utterance being assembled: pieces are fed in ``seq`` order."""

    req: Request
    next_seq: int = 0
    pending: dict[int, tuple[str, bool]] = field(default_factory=dict)
    held: int = 0  # characters waiting in `pending` (each piece counts at least one)
    timer: asyncio.TimerHandle | None = None


class MqttFront:
    name = "mqtt"

    def __init__(self, settings: MqttSettings, ctx: Context, topics: Topics, client_id: str,
                 scheduler: Scheduler | None = None, host: str | None = None) -> None:
        self.settings = settings
        self.ctx = ctx
        self.topics = topics
        self.client_id = client_id
        self.scheduler = scheduler
        self.host = host or settings.host or "127.0.0.1"
        self.connected = False
        self._client: mqtt.Client | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self._was_connected = False
        self._connect_failures = 0
        self._refused = ""
        self._streams: dict[str, _Stream] = {}
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._ended: OrderedDict[str, int] = OrderedDict()  # ended stream -> its next seq
        # Hermes requests taken: herald request id -> (topic, payload) of the reply owed
        self._hermes: dict[str, tuple[str, str]] = {}
        self._play_bytes = self._play_bytes_topic()
        self._tasks: set[asyncio.Task[Any]] = set()
        if scheduler:
            scheduler.add_listener(self._on_event)
        ctx.metrics.add_listener(self._on_latency)
        # Device state, work on every front, every latency record: each republishes the status.
        ctx.status.add_listener(self.publish_status)

    def _play_bytes_topic(self) -> str | None:
        """The Hermes audio server topic we take WAVs on (None: Hermes off or unusable)."""
        hermes = self.settings.hermes
        if not hermes.enabled:
            return None
        try:
            return Topics.hermes_play_bytes(hermes.site_id)
        except TopicError as e:
            log.error("MQTT: Hermes playBytes is off: %s", e)
            return None

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        v5 = self.settings.protocol == "5"
        client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=self.client_id,
                             protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311,
                             clean_session=None if v5 else False)
        client.will_set(*self.topics.will())
        if self.settings.username:
            client.username_pw_set(self.settings.username, self.settings.password)
        tls = self.settings.tls
        if tls.enabled:
            client.tls_set(ca_certs=str(tls.ca) if tls.ca else None,
                           certfile=str(tls.cert) if tls.cert else None,
                           keyfile=str(tls.key) if tls.key else None)
            client.tls_insecure_set(tls.insecure)
        client.reconnect_delay_set(min_delay=1, max_delay=30)
        client.max_queued_messages_set(10_000)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_connect_fail = self._on_connect_fail
        client.on_message = self._on_message
        if v5:
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = self.settings.session_expiry
            client.connect_async(self.host, self.settings.port, self.settings.keepalive,
                                 clean_start=False, properties=props)
        else:
            client.connect_async(self.host, self.settings.port, self.settings.keepalive)
        self._client = client
        client.loop_start()
        log.info("MQTT: connecting to %s:%d as %s (MQTT %s), base topic %s", self.host,
                 self.settings.port, self.client_id, self.settings.protocol, self.topics.base)

    async def stop(self) -> None:
        """Publish ``offline`` (waiting briefly for the broker to take it), then disconnect."""
        self._stopping = True
        for st in self._streams.values():
            if st.timer:
                st.timer.cancel()
        client = self._client
        if client is None:
            return
        if self.connected:
            info = client.publish(self.topics.availability, AVAILABILITY_OFFLINE, 1, True)
            try:
                await asyncio.to_thread(info.wait_for_publish, 2.0)
            except (RuntimeError, ValueError) as e:
                log.warning("MQTT: could not publish offline before leaving: %s", e)
        client.disconnect()
        # paho's thread may be inside a connect attempt (up to its 5 s timeout): wait in a
        # daemon thread of our own, so a slow broker can't hold up the process exit.
        if not await _run_in_daemon_thread(client.loop_stop, 3.0):
            log.warning("MQTT: the network thread did not stop within 3 s; leaving it")
        self._client = None
        log.info("MQTT: disconnected")

    # ------------------------------------------------------------------ publishing

    def publish(self, topic: str, payload: bytes | str, qos: int = 1,
                retain: bool = False) -> mqtt.MQTTMessageInfo | None:
        """Publish from any thread; QoS >= 1 messages wait in paho while disconnected. Every
        topic is checked (under a microsecond: not worth a caller-side shortcut)."""
        check_publish_topic(topic)
        if self._client is None:
            return None
        return self._client.publish(topic, payload, qos, retain)

    def publish_status(self) -> None:
        self.publish(self.topics.status, json.dumps(self.ctx.status.snapshot()), 1, True)

    def publish_discovery(self) -> None:
        if not self.settings.discovery.enabled:
            return
        voices = [i.name for i in self.ctx.engine.catalog.infos()]
        payload = discovery_payload(self.topics, self.ctx.version, voices)
        self.publish(self.topics.discovery, json.dumps(payload), 1, True)

    def _event(self, payload: dict[str, Any]) -> None:
        self.publish(self.topics.event, json.dumps(payload), 1, False)

    def _error(self, topic: str, message: str, request_id: str | None = None) -> None:
        with request_context(request_id):
            log.warning("MQTT %s: %s", topic, message)
        self.ctx.metrics.request(self.name, "rejected")
        ev: dict[str, Any] = {"event": "error"}
        if request_id is not None:
            ev["id"] = request_id
        ev["error"] = message
        ev["topic"] = topic
        self._event(ev)

    # ------------------------------------------------------------------ paho thread

    def _on_connect(self, client: mqtt.Client, userdata: Any, flags: mqtt.ConnectFlags,
                    reason: Any, properties: Any) -> None:
        if reason.is_failure:
            # Once per reason (paho retries with backoff): the log must not fill up.
            if str(reason) != self._refused:
                self._refused = str(reason)
                log.error("MQTT: broker %s:%d refused the connection: %s (check "
                          "mqtt.username, mqtt.password, mqtt.client_id and mqtt.protocol); "
                          "retrying with backoff", self.host, self.settings.port, reason)
            return
        self._refused = ""
        self._call(self._connected, flags.session_present)

    def _on_disconnect(self, client: mqtt.Client, userdata: Any, flags: Any, reason: Any,
                       properties: Any) -> None:
        was_connected, self.connected = self.connected, False
        if was_connected and not self._stopping:
            log.warning("MQTT: lost the broker at %s:%d (%s); reconnecting with backoff",
                        self.host, self.settings.port, reason)

    def _on_connect_fail(self, client: mqtt.Client, userdata: Any) -> None:
        self._connect_failures += 1
        if self._connect_failures != 1 and self._connect_failures % 20 != 0:
            return
        # paho calls this from inside its ``except OSError`` around the connect, so the error
        # in hand says why. A failed TLS handshake is a configuration problem, not a broker
        # that is down: say which settings to check.
        error = sys.exc_info()[1]
        if isinstance(error, ssl.SSLError):
            log.error("MQTT: TLS with the broker at %s:%d failed (attempt %d): %s (check "
                      "mqtt.tls.ca, mqtt.tls.cert and mqtt.tls.key, and that mqtt.host is a "
                      "name in the broker's certificate); retrying", self.host,
                      self.settings.port, self._connect_failures, error)
        else:
            log.warning("MQTT: cannot reach the broker at %s:%d (attempt %d); retrying "
                        "(is it running? see mqtt.host / mqtt.port)", self.host,
                        self.settings.port, self._connect_failures)

    def _on_message(self, client: mqtt.Client, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        self._call(self._dispatch, msg.topic, msg.payload, msg.retain, Timeline())

    def _call(self, fn: Any, *args: Any) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop closed under us: shutting down
            pass

    # ------------------------------------------------------------------ event loop

    def _connected(self, session_present: bool) -> None:
        if self._client is None or self._stopping:
            return
        self.connected = True
        self._connect_failures = 0
        log.info("MQTT: connected to %s:%d (%s session)%s", self.host, self.settings.port,
                 "resumed" if session_present else "new",
                 ", again" if self._was_connected else "")
        self._was_connected = True
        topics = self.topics.commands()
        if self.settings.discovery.enabled:
            topics.append(self.topics.ha_status)
        if self.settings.hermes.enabled:
            topics.append(Topics.HERMES_SAY)
        if self._play_bytes:
            topics.append(self._play_bytes)
        if self.settings.protocol == "5":
            self._client.subscribe([(t, SubscribeOptions(qos=1)) for t in topics])
        else:
            self._client.subscribe([(t, 1) for t in topics])
        self.publish(self.topics.availability, AVAILABILITY_ONLINE, 1, True)
        self.publish_status()
        self.publish_discovery()

    def _dispatch(self, topic: str, payload: bytes, retained: bool, t: Timeline) -> None:
        t_ = self.topics
        handlers = {t_.say: self._on_say, t_.say_stream: self._on_stream, t_.stop: self._on_stop,
                    t_.set_volume: self._on_volume, t_.set_voice: self._on_voice,
                    t_.ha_status: self._on_ha_status, Topics.HERMES_SAY: self._on_hermes}
        handler = handlers.get(topic)
        if handler is None and self._play_bytes:
            play_id = Topics.hermes_play_bytes_id(topic, self.settings.hermes.site_id)
            if play_id is not None:
                self._on_play_bytes(topic, play_id, payload, retained, t)
                return
        if handler is None:
            log.debug("MQTT: ignoring message on %s", topic)
            return
        try:
            if retained and topic not in (t_.ha_status, Topics.HERMES_SAY):
                raise RequestError("retained command ignored: publish commands without the "
                                   "retain flag (clear it with an empty retained message)")
            handler(payload, t)
        except RequestError as e:
            self._error(topic, str(e), e.id)
        except Exception as e:
            log.exception("MQTT: handling a message on %s failed", topic)
            self._error(topic, f"internal error: {e}")

    # --- commands

    def _limits(self) -> Limits:
        sinks = self.scheduler.available_sinks() if self.scheduler else ()
        default = ("speaker",) if "speaker" in sinks else ("mqtt",)
        return Limits(self.settings.max_text, default, self._resolve_voice,
                      self.ctx.engine.check_speaker, self.settings.max_age)

    def _resolve_voice(self, name: str | None) -> str:
        """A voice name or language; none: the default set on ``set/voice``."""
        return self.ctx.engine.resolve_voice(name, default=self.ctx.state.voice)

    def _scheduler(self, request_id: str | None = None) -> Scheduler:
        if self.scheduler is None:
            raise RequestError("this herald has no scheduler (speaker and MQTT audio are "
                               "both off)", request_id)
        return self.scheduler

    def _remember(self, request_id: str) -> None:
        self._seen[request_id] = None
        while len(self._seen) > _REMEMBERED_IDS:
            self._seen.popitem(last=False)

    def _on_say(self, payload: bytes, t: Timeline) -> None:
        req = parse_say(payload, self._limits(), self.name, t)
        if req.id in self._seen:
            raise RequestError(f"duplicate request id {req.id!r}: already received, not "
                               "spoken twice", req.id)
        self._scheduler(req.id).submit(req)
        self._remember(req.id)  # only once accepted: a refused request may be sent again

    def _on_stream(self, payload: bytes, t: Timeline) -> None:
        piece = parse_stream_piece(payload)
        st = self._streams.get(piece.id)
        if st is None:
            ended_at = self._ended.get(piece.id)
            if ended_at is not None and piece.seq is not None and piece.seq < ended_at:
                log.debug("MQTT say/stream %s: late duplicate piece %d ignored", piece.id,
                          piece.seq)
                return
            if piece.id in self._seen:
                raise RequestError(f"stream {piece.id!r} has already ended; start a new "
                                   "stream with a new id", piece.id)
            # Remember the id even if the first piece is refused, so the pieces after it
            # don't start the stream from the middle.
            self._remember(piece.id)
            req = stream_request(piece, self._limits(), self.name, t)
            st = _Stream(req)
            self._streams[req.id] = st
            try:
                self._scheduler(req.id).submit(req)
            except RequestError:
                del self._streams[req.id]
                raise
        if piece.seq is None:
            self._feed(st, piece.text, piece.final)
        elif piece.seq < st.next_seq or piece.seq in st.pending:
            log.debug("MQTT say/stream %s: duplicate piece %d ignored", piece.id, piece.seq)
        else:
            size = max(1, len(piece.text))  # so that empty pieces cannot pile up either
            if not self._too_long(st, size):
                st.pending[piece.seq] = (piece.text, piece.final)
                st.held += size
            while st.next_seq in st.pending and st.req.id in self._streams:
                text, final = st.pending.pop(st.next_seq)
                st.held -= max(1, len(text))
                st.next_seq += 1
                self._feed(st, text, final)
        if st.req.id in self._streams:
            if st.timer:
                st.timer.cancel()
            assert self._loop is not None
            st.timer = self._loop.call_later(self.settings.stream_timeout,
                                             self._stream_timeout, st.req.id)

    def _too_long(self, st: _Stream, more: int) -> bool:
        """End the stream with an error if ``more`` characters would take it past
        mqtt.max_text. Pieces held for a missing earlier one count too: they would otherwise
        pile up unchecked for as long as pieces keep coming (stream_timeout restarts)."""
        stream = st.req.stream
        assert stream is not None
        if stream.total_chars + st.held + more <= self.settings.max_text:
            return False
        self._end_stream(st.req.id)
        stream.fail(RequestError(f"stream text exceeds {self.settings.max_text} characters "
                                 "(mqtt.max_text); the rest is not spoken", st.req.id))
        return True

    def _feed(self, st: _Stream, text: str, final: bool) -> None:
        stream = st.req.stream
        assert stream is not None
        if self._too_long(st, len(text)):
            return
        st.req.text += text
        if final and not st.req.text.strip():
            self._end_stream(st.req.id)
            stream.fail(RequestError("empty text: nothing to say", st.req.id))
            return
        stream.feed(text, final)
        if final:
            self._end_stream(st.req.id)

    def _end_stream(self, request_id: str) -> None:
        st = self._streams.pop(request_id, None)
        if st is None:
            return
        if st.timer:
            st.timer.cancel()
        self._ended[request_id] = st.next_seq  # pieces below this are duplicates
        while len(self._ended) > _REMEMBERED_IDS:
            self._ended.popitem(last=False)

    def _stream_timeout(self, request_id: str) -> None:
        st = self._streams.get(request_id)
        if st is None:
            return
        self._end_stream(request_id)
        assert st.req.stream is not None
        why = (f"piece {st.next_seq} never arrived (have {min(st.pending)}..)" if st.pending
               else "no final piece")
        st.req.stream.fail(RequestError(
            f"stream {request_id!r}: nothing usable for {self.settings.stream_timeout:g} s "
            f"and {why} (mqtt.stream_timeout); seq starts at 0, and a piece with "
            "\"final\": true ends a stream", request_id))

    def _on_stop(self, payload: bytes, t: Timeline) -> None:
        if len(payload) > _STOP_TEXT_MAX:
            raise RequestError("stop payload too long: send nothing, PRESS, or {\"id\": \"...\"}")
        text = decode_text(payload).strip()
        scheduler = self._scheduler()
        if not text.startswith("{"):
            stopped = scheduler.stop()
            log.info("MQTT stop: stopped %s", ", ".join(stopped) or "nothing (idle)")
            return
        request_id = json_object(text, '{"id": "..."}').get("id")
        if not isinstance(request_id, str):
            raise RequestError("stop JSON must be {\"id\": \"...\"}")
        scheduler.stop(request_id)

    def _on_volume(self, payload: bytes, t: Timeline) -> None:
        text = decode_text(payload[:64]).strip() if len(payload) <= 64 else None
        try:
            value = float(json.loads(text)) if text else math.nan
        except (ValueError, TypeError):
            value = math.nan
        if not 0.0 <= value <= 1.0:
            shown = repr(text) if text is not None else f"{len(payload)} bytes"
            raise RequestError(f"volume must be a number from 0 to 1 (got {shown})")
        log.info("MQTT: volume set to %.2f", value)
        self.ctx.state.set_volume(value)  # the speaker and the status follow

    def _on_voice(self, payload: bytes, t: Timeline) -> None:
        text = decode_text(payload).strip()
        if text.startswith("{") or text.startswith('"'):
            data = parse_json(text)
            name = data.get("voice") if isinstance(data, dict) else data
            if not isinstance(name, str):
                raise RequestError("set/voice takes a voice name, or {\"voice\": \"NAME\"}")
            text = name.strip()
        if not text:
            raise RequestError("empty voice name; installed: " + ", ".join(
                i.name for i in self.ctx.engine.catalog.infos()))
        try:
            voice = self._resolve_voice(text)
        except VoiceError as e:
            raise RequestError(str(e)) from None
        log.info("MQTT: default voice set to %s", voice)
        self.ctx.state.set_voice(voice)  # the status follows
        self._spawn(self._preload(voice))

    async def _preload(self, voice: str) -> None:
        try:
            await self.ctx.engine.preload(voice)
        except Exception as e:
            log.error("could not load voice %s: %s", voice, e)

    def _on_ha_status(self, payload: bytes, t: Timeline) -> None:
        if payload.strip() == b"online":
            log.info("MQTT: Home Assistant is online: republishing discovery")
            self.publish(self.topics.availability, AVAILABILITY_ONLINE, 1, True)
            self.publish_status()
            self.publish_discovery()

    def _on_hermes(self, payload: bytes, t: Timeline) -> None:
        say = parse_hermes_say(payload, self.settings.hermes.site_id, self._limits(), t)
        if say is None:
            return
        self._scheduler(say.request.id).submit(say.request)
        self._hermes[say.request.id] = (Topics.HERMES_SAY_FINISHED, say_finished(say))

    def _on_play_bytes(self, topic: str, hermes_id: str, payload: bytes, retained: bool,
                       t: Timeline) -> None:
        """A WAV to play on the speaker, in the queue like speech. playFinished always
        follows, also for a WAV refused here: Rhasspy's dialogue waits for it."""
        site = self.settings.hermes.site_id
        reply = (Topics.hermes_play_finished(site), play_finished(hermes_id, site))
        try:
            if retained:
                raise RequestError("retained playBytes ignored: publish audio without the "
                                   "retain flag (clear it with an empty retained message)")
            play = parse_hermes_play(hermes_id, payload, site, t)
            req = play.request
            if req.id in self._seen:
                raise RequestError(f"duplicate request id {req.id!r}: already received, not "
                                   "played twice", req.id)
            self._scheduler(req.id).submit(req)
        except RequestError as e:
            self._error(topic, str(e), e.id)
            self.publish(*reply, 1, False)
            return
        except Exception as e:
            log.exception("MQTT: handling a message on %s failed", topic)
            self._error(topic, f"internal error: {e}")
            self.publish(*reply, 1, False)
            return
        self._remember(req.id)
        self._hermes[req.id] = reply

    # --- outputs

    def _on_event(self, ev: dict[str, Any]) -> None:
        self._event(ev)
        if ev["event"] in TERMINAL:
            self._end_stream(ev["id"])
            reply = self._hermes.pop(ev["id"], None)
            if reply is not None:
                self.publish(*reply, 1, False)
        self.publish_status()

    def _on_latency(self, rec: LatencyRecord) -> None:
        self.publish(self.topics.latency, json.dumps(rec.as_dict()), 1, False)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)



async def _run_in_daemon_thread(fn: Any, timeout: float) -> bool:
    """Run a blocking call off the loop; True if it returned within ``timeout``."""
    loop = asyncio.get_running_loop()
    done = asyncio.Event()

    def target() -> None:
        try:
            fn()
        finally:
            try:
                loop.call_soon_threadsafe(done.set)
            except RuntimeError:  # the loop is gone: nobody is waiting any more
                pass

    threading.Thread(target=target, daemon=True, name="herald-mqtt-stop").start()
    try:
        await asyncio.wait_for(done.wait(), timeout)
        return True
    except TimeoutError:
        return False
