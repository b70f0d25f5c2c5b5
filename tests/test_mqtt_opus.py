"""MQTT audio as Ogg Opus (``mqtt.audio.format = "opus"``): ``herald run`` against a real
Mosquitto, a subscriber that joins the chunks in order and decodes them with ffmpeg, and
herald's own synthesis of the same text to compare with."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from audio_checks import assert_codec_audio, ffmpeg_decode, pcm16, reference_pcm
from conftest import Broker
from herald_process import HeraldProcess, herald_env, start_herald
from mqtt_client import DEVICE, Client

from tts import SynthesisOptions
from tts.resample import Resampler

TEXT = "The kitchen timer is done. Dinner is ready!"


@pytest.fixture
def herald(broker: Broker, tmp_path: Path) -> Iterator[HeraldProcess]:
    config = tmp_path / "herald.toml"
    config.write_text(f"""
device_id = "{DEVICE}"
[mqtt]
host = "127.0.0.1"
port = {broker.port}
[mqtt.audio]
format = "opus"
chunk_ms = 100
[speaker]
enabled = false
[wyoming]
enabled = false
[http]
enabled = false
""")
    h = start_herald(config, tmp_path / "herald.log", herald_env())
    yield h
    h.kill()


def test_opus_chunks_make_one_ogg_opus_stream(herald: HeraldProcess, broker: Broker,
                                              synth: Any) -> None:
    client = Client(broker.port)
    try:
        client.wait_online()
        client.say(id="op1", text=TEXT, sinks=["mqtt"], seed=7)
        assert client.wait_event("op1")["event"] == "finished"
        start, data, stop = client.audio("op1")
        with client.cond:
            chunks = [m.payload for m in client.msgs if "/audio/op1/chunk/" in m.topic]
    finally:
        client.close()
    assert start == {"format": "opus", "content_type": "audio/ogg; codecs=opus",
                     "rate": 48000, "channels": 1}
    # Whole Ogg pages in every chunk: a player can hand each to its decoder as it arrives.
    assert len(chunks) > 5 and all(c.startswith(b"OggS") for c in chunks)
    first = ffmpeg_decode(chunks[0], synth.sample_rate)  # headers and the first page(s)
    assert len(first) >= synth.sample_rate // 50, "the first chunk holds no Opus frame"

    want = reference_pcm(synth, TEXT, SynthesisOptions(seed=7))
    assert stop == {"chunks": len(chunks), "outcome": "finished",
                    "samples": Resampler(synth.sample_rate, 48000).expected_length(len(want) // 2)}
    assert len(data) < len(want) / 4, f"{len(data)} bytes of Opus for {len(want)} of PCM"
    assert_codec_audio("opus", ffmpeg_decode(data, synth.sample_rate), pcm16(want),
                       synth.sample_rate)
    assert herald.proc.poll() is None, herald.tail()


def test_bad_format_stops_herald_with_the_key(tmp_path: Path) -> None:
    config = tmp_path / "herald.toml"
    config.write_text('[mqtt.audio]\nformat = "mp3"\n')
    h = start_herald(config, tmp_path / "herald.log", herald_env())
    assert h.proc.wait(60) != 0
    assert "mqtt.audio.format" in h.output() and "'pcm' or 'opus'" in h.output(), h.tail()


