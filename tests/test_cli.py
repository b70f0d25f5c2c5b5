"""The command line as a user runs it: `herald say`, `herald voices`, and their errors."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest
from audio_checks import assert_pcm_close, assert_speech, pcm16
from conftest import ROOT, AlsaFile, Broker, voices_of_default
from fresh_python import run_python
from herald_process import herald_env, start_herald
from mqtt_client import Client

from daemon.cli import main

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


def test_say_to_the_sound_device(alsa_file, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """What `say` plays is the speech `say --out` writes (no sampling noise: the same
    synthesis). ALSA's file plugin in front of the null PCM takes audio faster than real
    time, so while the next chunk is being made the sink pads with silence, as much as the
    host's speed makes: the played speech is the recording without those zeros."""
    quiet = ("--noise-scale", "0", "--noise-w", "0")
    r = run("say", *quiet, "Hello from herald.", env=alsa_file.env)
    assert r.returncode == 0, r.stderr
    assert run("say", *quiet, "Hello from herald.", "--out", str(tmp_path / "x.wav")
               ).returncode == 0
    with wave.open(str(tmp_path / "x.wav")) as w:
        written = pcm16(w.readframes(w.getnframes()))
    played = pcm16(alsa_file.pcm())
    assert_speech(played[played != 0], 22050, min_seconds=0.6)
    voiced = np.count_nonzero(np.abs(played) > 0.02)
    assert voiced == pytest.approx(np.count_nonzero(np.abs(written) > 0.02), rel=0.03)


def test_voices_lists_the_default() -> None:
    r = run("voices", "--json")
    assert r.returncode == 0, r.stderr
    voices = json.loads(r.stdout)
    joe = next(v for v in voices if v["name"] == "en_US-joe-medium")
    assert joe["default"] and joe["language"] == "en_US" and joe["sample_rate"] == 22050
    table = run("voices").stdout
    assert "en_US-joe-medium" in table and "medium" in table


def test_voices_loads_no_front() -> None:
    """`herald voices` reads the settings and the catalog only: the settings import no front,
    so listing voices never loads the network libraries."""
    code = ("import sys\nfrom daemon.cli import main\nassert main(['voices']) == 0\n"
            "print(' '.join(m for m in ('aiohttp', 'wyoming', 'paho') if m in sys.modules))")
    r = run_python(code)
    assert "en_US-joe-medium" in r.stdout
    assert r.stdout.splitlines()[-1] == "", f"loaded: {r.stdout.splitlines()[-1]}"


def test_the_teardown_leaves_what_the_process_made_out_of_its_garbage_collections() -> None:
    """At exit the interpreter collects garbage over every object still tracked, several
    times over; torch's import alone makes some 180,000, which made ``herald say``'s teardown
    half a second. By the time the teardown begins (after the last exit handler) they are
    frozen out of those collections: the ones made before exit, every one of them."""
    code = ("import atexit, gc, sys, torch\n"
            "atexit.register(lambda: print('frozen', gc.get_freeze_count(),\n"
            "                              len(gc.get_objects())))\n"
            "from daemon.cli import main\nassert main(['voices']) == 0\n")
    last = run_python(code).stdout.splitlines()[-1]
    _, frozen, tracked = last.split()
    assert int(frozen) > 100_000 and int(tracked) < 1_000, last


def test_voices_and_say_read_the_configs_voices(tmp_path: Path) -> None:
    """A voice added in voices.directories is seen by `herald voices` as by the daemon."""
    voices = tmp_path / "voices"
    voices.mkdir()
    config = json.loads((voices_of_default() / "en_US-joe-medium.onnx.json").read_text())
    config["language"] = {"code": "xx_XX"}
    (voices / "xx_XX-extra-medium.onnx.json").write_text(json.dumps(config))
    (voices / "xx_XX-extra-medium.onnx").write_bytes(b"")  # listing reads only the JSON
    toml = tmp_path / "herald.toml"
    toml.write_text(f'[voices]\ndirectories = ["{voices}"]\ndefault = "xx_XX-extra-medium"\n')
    listed = {v["name"]: v for v in json.loads(run("voices", "--json", "--config",
                                                   str(toml)).stdout)}
    assert listed["xx_XX-extra-medium"]["default"] and not listed["en_US-joe-medium"]["default"]
    plain = {v["name"] for v in json.loads(run("voices", "--json").stdout)}
    assert "xx_XX-extra-medium" not in plain
    toml.write_text("[voices]\ndirectorys = []\n")
    r = run("say", "hi", "--config", str(toml), "--out", str(tmp_path / "x.wav"))
    assert r.returncode == 2 and "voices.directorys: unknown setting" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "x.wav").exists()


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


# --------------------------------------------------------------------------- user mistakes


@pytest.mark.parametrize("args, message", [
    (["say", "Hi.", "--length-scale", "0"], "argument --length-scale: Input should be greater "
     "than or equal to 0.25 (got '0')"),
    (["say", "Hi.", "--length-scale", "-1"], "greater than or equal to 0.25"),
    (["say", "Hi.", "--length-scale", "nan"], "must be a finite number, got 'nan'"),
    (["say", "Hi.", "--length-scale", "inf"], "must be a finite number, got 'inf'"),
    (["say", "Hi.", "--noise-scale", "-1"], "argument --noise-scale: Input should be greater"),
    (["say", "Hi.", "--noise-w", "3"], "argument --noise-w: Input should be less than or equal "
     "to 2"),
    (["say", "Hi.", "--gain", "0"], "argument --gain: Input should be greater than 0"),
    (["say", "Hi.", "--threads", "0"], "argument --threads: Input should be greater than or "
     "equal to 1"),
    (["bench", "--repeats", "0"], "argument --repeats: expected a whole number >= 1"),
    (["bench", "--threads", "1", "0"], "argument --threads: Input should be greater"),
])
def test_out_of_range_options_are_refused_before_any_work(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
        ) -> None:
    """The same bounds as the config keys (synthesis.*, voices.threads); before, a length
    scale of 0 was silently the voice's own, a negative one or NaN a torch traceback."""
    out = tmp_path / "x.wav"
    with pytest.raises(SystemExit) as e:
        main([*args, "--out", str(out)] if args[0] == "say" else args)
    assert e.value.code == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_say_out_that_cannot_be_written_is_one_line(tmp_path: Path) -> None:
    for out, why in ((tmp_path / "missing" / "x.wav", "No such file or directory"),
                     (tmp_path, "Is a directory")):
        r = run("say", "Hello.", "--out", str(out))
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert f"herald say: cannot write {out}: {why}" in r.stderr


def test_say_nothing_to_pronounce_keeps_the_file(tmp_path: Path) -> None:
    """'...' is refused as the daemon's fronts refuse it, not written as an empty WAV; a file
    that was there stays as it was, and none is left behind when there was none."""
    kept = tmp_path / "kept.wav"
    kept.write_bytes(b"earlier")
    for out in (kept, tmp_path / "new.wav"):
        r = run("say", "...", "--out", str(out))
        assert r.returncode == 2, r.stderr
        assert "nothing espeak-ng can pronounce" in r.stderr
    assert kept.read_bytes() == b"earlier"
    assert not (tmp_path / "new.wav").exists()


def test_say_reads_stdin_and_refuses_what_is_not_utf8(tmp_path: Path) -> None:
    out = tmp_path / "stdin.wav"
    ok = subprocess.run([*HERALD, "say", "-", "--out", str(out)], input=b"Hello from stdin.",
                        capture_output=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    with wave.open(str(out)) as w:
        assert_speech(pcm16(w.readframes(w.getnframes())), 22050, min_seconds=0.6)
    bad = subprocess.run([*HERALD, "say", "-", "--out", str(tmp_path / "bad.wav")],
                         input=b"\xff\xfe hello", capture_output=True, timeout=120)
    assert bad.returncode == 2 and b"Traceback" not in bad.stderr, bad.stderr
    assert b"standard input is not valid UTF-8 (byte 0)" in bad.stderr
    assert not (tmp_path / "bad.wav").exists()


def test_say_unknown_sound_device_lists_the_devices(alsa_file) -> None:  # type: ignore[no-untyped-def]
    """`herald say --device` finds devices as the daemon's speaker.device does (it plays
    through the same sink), and a wrong one is one line naming those there are."""
    r = run("say", "Hello.", "--device", "no-such-card", env=alsa_file.env)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "no sound device 'no-such-card'" in r.stderr and "0 'default'" in r.stderr
    assert "retrying" not in r.stderr, "the daemon's retry line means nothing to a one-off say"
    assert alsa_file.pcm() == b""


def test_say_mqtt_refuses_what_it_cannot_send(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """--mqtt asks a daemon: a WAV file, a device or local voices would be silently
    ignored, so they are refused (before any connection); --device-id needs --mqtt."""
    out = str(tmp_path / "x.wav")
    assert main(["say", "Hi.", "--mqtt", "127.0.0.1:1", "--out", out, "--gain", "2"]) == 2
    assert "--out, --gain cannot be used with --mqtt" in capsys.readouterr().err
    assert main(["say", "Hi.", "--device-id", "kitchen", "--out", out]) == 2
    assert "--device-id names the daemon to ask, so it needs --mqtt" in capsys.readouterr().err
    assert not (tmp_path / "x.wav").exists()


def test_verbose_works_after_the_command_too(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing.toml"
    for argv in (["-v", "run", "--config", str(missing)], ["run", "-v", "--config", str(missing)]):
        assert main(argv) == 2
        assert f"config file {missing} not found" in capsys.readouterr().err


def test_readme_lists_the_options_say_takes() -> None:
    """README's list of `herald say` options is the parser's, and every option has help."""
    text = (ROOT / "README.md").read_text()
    listed = re.search(r"`herald say --help` lists every option \((.*?)\);", text, re.S)
    assert listed, "README no longer has the list"
    in_readme = set(re.findall(r"`(--[\w-]+)`", listed[1]))
    help_text = run("say", "--help").stdout
    in_help = set(re.findall(r"^  (--[\w-]+)", help_text, re.M))
    assert in_readme == in_help - {"--help", "--verbose"}


def test_say_mqtt_finds_the_daemon_under_its_configured_base_topic(
        tmp_path: Path, broker: Broker, alsa_file: AlsaFile) -> None:
    """`herald say --mqtt` derives the topics from the same settings, with the same code, as
    the daemon: with mqtt.base_topic set, it used to publish to herald/<hostname>/say."""
    base = "home/speakers/kitchen"
    config = tmp_path / "herald.toml"
    config.write_text(f"""
device_id = "kitchen"
[mqtt]
host = "127.0.0.1"
port = {broker.port}
base_topic = "{base}"
[wyoming]
enabled = false
[http]
enabled = false
""")
    herald = start_herald(config, tmp_path / "herald.log", herald_env(base=alsa_file.env))
    watcher = Client(broker.port, topics=(f"{base}/#",))
    try:
        watcher.wait(lambda ms: any(m.topic == f"{base}/availability" and m.payload == b"online"
                                    for m in ms), 60, "herald online under its base topic")
        out = subprocess.run([sys.executable, "-m", "daemon.cli", "say", "--mqtt",
                              f"127.0.0.1:{broker.port}", "--config", str(config),
                              "The base topic is mine."], cwd=ROOT, env=herald_env(),
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert "finished" in out.stdout
        assert [m.topic for m in watcher.msgs if m.topic.endswith("/say")] == [f"{base}/say"]
    finally:
        watcher.close()
        herald.kill()
