"""A request's field means the same, and is refused in the same words, on every front: MQTT's
``say``, HTTP's fields (a JSON body's strictly, a form's as text), Hermes and Wyoming's
events. The fronts' own parsers run here on their real inputs; the voices are stand-ins,
since no field below gets as far as a voice."""

from __future__ import annotations

import json
from typing import Any

import pytest
from wyoming.event import Event
from wyoming.tts import Synthesize

from daemon.errors import RequestError
from daemon.fronts.http.fields import HttpFields, request_fields
from daemon.fronts.mqtt.hermes import parse_hermes_say
from daemon.fronts.wyoming.protocol import Refused, parse_event
from daemon.mqtt.payload import Limits, parse_say


def _check_speaker(voice: str, speaker: str | int | None) -> None:
    """A voice with one speaker."""
    if speaker is not None:
        raise RequestError(f"{voice} has a single speaker; got {speaker!r}", code="bad-voice")


LIMITS = Limits(max_text=200, default_sinks=("speaker",), resolve_voice=lambda name: "v",
                check_speaker=_check_speaker)

# (a field, its refusal on every front)
BAD = [
    ({"rate": 10}, "'rate' is 10.0; it must be from 0.25 to 4.0"),
    ({"rate": "fast"}, "'rate' must be a number from 0.25 to 4.0, not 'fast'"),
    ({"rate": "1.5"}, "'rate' must be a number from 0.25 to 4.0, not '1.5'"),  # JSON: no number
    ({"seed": 1.5}, "'seed' must be a whole number from 0 to 9223372036854775807, not 1.5"),
    ({"seed": True}, "'seed' must be a whole number from 0 to 9223372036854775807, not true"),
    ({"speaker": 1.5}, "'speaker' must be a speaker name or a whole number (its index), not 1.5"),
    ({"format": "html"}, "'format' must be one of text, ssml, not 'html'"),
    ({"voice": 5}, "'voice' must be a string, not a number"),
    ({"text": 5}, "'text' must be a string, not a number"),
    ({"text": None}, "missing 'text': the text to speak"),
]


def _refusal(call: Any) -> str:
    with pytest.raises(RequestError) as e:
        call()
    return str(e.value)


@pytest.mark.parametrize(("fields", "words"), BAD, ids=[json.dumps(b[0]) for b in BAD])
def test_mqtt_and_http_refuse_a_field_in_the_same_words(fields: dict[str, Any],
                                                        words: str) -> None:
    body = {"text": "hi", **fields}
    mqtt = _refusal(lambda: parse_say(json.dumps(body).encode(), LIMITS))
    http = _refusal(lambda: request_fields(HttpFields(body)))
    assert mqtt == http == words


def test_a_form_field_is_text_and_a_json_one_is_typed() -> None:
    form = request_fields(HttpFields({"text": "hi", "rate": "1.5", "seed": "7", "voice": ""},
                                     texts={"text", "rate", "seed", "voice"}))
    assert (form.rate, form.seed, form.voice) == (1.5, 7, None)
    typed = request_fields(HttpFields({"text": "hi", "rate": 1.5, "seed": 7.0}))
    assert (typed.rate, typed.seed) == (1.5, 7)
    assert parse_say(b'{"text": "hi", "rate": 1.5, "seed": 7.0}', LIMITS).seed == 7


def test_unknown_fields_are_refused_alike() -> None:
    mqtt = _refusal(lambda: parse_say(b'{"text": "hi", "voise": "x"}', LIMITS))
    assert mqtt.startswith("unknown field 'voise'; known fields: ")


def test_hermes_reads_its_text_as_every_front_does() -> None:
    def hermes(data: dict[str, Any]) -> str:
        return _refusal(lambda: parse_hermes_say(json.dumps(data).encode(), "default", LIMITS))

    assert hermes({"text": 5}) == "'text' must be a string, not a number"
    assert hermes({"siteId": "default"}) == "missing 'text': the text to speak"
    assert hermes({"text": " "}) == "empty 'text': nothing to say"
    say = parse_hermes_say(b'{"text": "hi", "siteId": "default", "lang": "en", "x": 1}',
                           "default", LIMITS)
    assert say is not None and say.request.text == "hi"  # Rhasspy's other fields: not ours


@pytest.mark.parametrize(("voice", "words"), [
    ({"name": 5}, "'synthesize.data.voice.name' must be a string, not a number"),
    ({"name": "v", "speaker": True}, "'synthesize.data.voice.speaker' must be a speaker name "
     "or a whole number (its index), not true/false"),
])
def test_wyoming_names_the_field_as_its_event_carries_it(voice: dict[str, Any],
                                                         words: str) -> None:
    with pytest.raises(Refused) as e:
        parse_event(Synthesize, Event("synthesize", {"text": "hi", "voice": voice}))
    assert (e.value.code, e.value.text) == ("bad-request", words)
    with pytest.raises(Refused) as e:
        parse_event(Synthesize, Event("synthesize", {"text": 42}))
    assert e.value.text == "'synthesize.data.text' must be a string, not a number"
