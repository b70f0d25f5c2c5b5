"""The command line as a user runs it: `herald say`, `herald voices`, and their errors."""

from __future__ import annotations

import json
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
from audio_checks import assert_pcm_close, assert_speech, pcm16

HERALD = [sys.executable, "-m", "daemon.cli"]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*HERALD, *args], capture_output=True, text=True, timeout=120,
                          env=env)


def test_say_writes_a_wav(tmp_path: Path) -> None:
    out = tmp_path / "hello.wav"
    r = run("say", "Hello from herald.", "--out", str(out))
    assert r.returncode == 0, r.stderr
    with wave.open(str(out)) as w:
        assert (w.getframerate(), w.getsampwidth(), w.getnchannels()) == (22050, 2, 1)
        audio = pcm16(w.readframes(w.getnframes()))
    assert_speech(audio, 22050, min_seconds=0.6, max_seconds=2.5)


def test_say_rate_changes_length(tmp_path: Path) -> None:
    lengths = []
    for scale in ("1.0", "1.6"):
        out = tmp_path / f"{scale}.wav"
        r = run("say", "Turn on the kitchen lights.", "--out", str(out), "--length-scale", scale,
                "--noise-w", "0")
        assert r.returncode == 0, r.stderr
        with wave.open(str(out)) as w:
            lengths.append(w.getnframes())
    assert lengths[1] > 1.4 * lengths[0]


def test_say_ssml_and_bracket_tags(tmp_path: Path) -> None:
    """--ssml reads SSML; plain text takes bracket tags: the same 500 ms pause either way."""
    texts = {"plain": ["Wait here."], "tag": ["Wait [pause 500ms] here."],
             "ssml": ['<speak>Wait <break time="500ms"/> here.</speak>', "--ssml"]}
    audio = {}
    for name, args in texts.items():
        out = tmp_path / f"{name}.wav"
        r = run("say", *args, "--out", str(out), "--noise-scale", "0", "--noise-w", "0")
        assert r.returncode == 0, r.stderr
        with wave.open(str(out)) as w:
            audio[name] = np.frombuffer(w.readframes(w.getnframes()), "<i2")
    assert_speech(audio["ssml"] / 32767.0, 22050, min_seconds=1.0)
    assert len(audio["ssml"]) - len(audio["plain"]) >= 0.45 * 22050
    assert_pcm_close(audio["tag"], audio["ssml"], "the SSML's audio")


def test_malformed_ssml_is_one_clear_line(tmp_path: Path) -> None:
    out = tmp_path / "x.wav"
    r = run("say", "<speak>Hi <break></speak>", "--ssml", "--out", str(out))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "malformed SSML at line 1, column 20" in r.stderr
    assert not out.exists()


def test_say_to_the_sound_device(alsa_file) -> None:  # type: ignore[no-untyped-def]
    r = run("say", "Hello from herald.", env=alsa_file.env)
    assert r.returncode == 0, r.stderr
    audio = pcm16(alsa_file.pcm())
    assert_speech(audio, 22050, min_seconds=0.6)


def test_voices_lists_the_default() -> None:
    r = run("voices", "--json")
    assert r.returncode == 0, r.stderr
    voices = json.loads(r.stdout)
    joe = next(v for v in voices if v["name"] == "en_US-joe-medium")
    assert joe["default"] and joe["language"] == "en_US" and joe["sample_rate"] == 22050
    table = run("voices").stdout
    assert "en_US-joe-medium" in table and "medium" in table


def test_errors_are_one_clear_line(tmp_path: Path) -> None:
    r = run("say", "   ", "--out", str(tmp_path / "x.wav"))
    assert r.returncode == 2 and "empty text" in r.stderr and "Traceback" not in r.stderr
    r = run("say", "Hi.", "--voice", "nope", "--out", str(tmp_path / "x.wav"))
    assert r.returncode == 2 and "unknown voice 'nope'" in r.stderr
    assert "en_US-joe-medium" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "x.wav").exists()


def test_help_is_complete() -> None:
    r = run("say", "--help")
    for flag in ("--voice", "--speaker", "--out", "--length-scale", "--noise-scale", "--noise-w",
                 "--gain", "--device", "--mqtt", "--ssml"):
        assert flag in r.stdout
    assert np.all([c in run("--help").stdout for c in ("run", "say", "voices", "bench")])
