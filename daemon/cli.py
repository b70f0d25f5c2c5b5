"""``herald run | say | voices | bench`` — the command line."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from tts import SynthesisOptions, VoiceCatalog, VoiceError, set_threads, to_pcm16, wav_bytes
from tts.audio import AudioFormat
from tts.compose import Composer
from tts.text import MarkupError

from . import __version__

log = logging.getLogger("herald")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="herald",
        description="Streaming text-to-speech daemon: MQTT, Wyoming and HTTP in, "
        "speaker or network audio out.",
    )
    p.add_argument("--version", action="version", version=f"herald {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser(
        "run", help="run the daemon (MQTT, Wyoming, HTTP)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run herald: MQTT (embedded broker when mqtt.host is empty), Wyoming on "
        "tcp://127.0.0.1:10200, HTTP and the web page on http://127.0.0.1:8000/.",
        epilog="settings, each overriding the one before:\n"
        "  built-in defaults < the TOML file < HERALD_<SECTION>__<KEY> environment "
        "variables < --set\n"
        "sections: voices, synthesis, scheduler, mqtt (.tls .audio .discovery .hermes), "
        "speaker, wyoming, http\n"
        "every key, with its default and meaning: config/herald.toml\n"
        "examples:\n"
        "  herald run --set mqtt.host=broker.lan --set mqtt.username=herald\n"
        "  HERALD_SPEAKER__DEVICE=hw:1 herald run --config /etc/herald/herald.toml")
    run.add_argument("--config", type=Path, metavar="FILE",
                     help="TOML config file (default: ./herald.toml or /etc/herald/herald.toml "
                     "if present)")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="override one setting, e.g. --set mqtt.host=broker.lan (repeatable)")

    def voice_args(q: argparse.ArgumentParser) -> None:
        q.add_argument("--voice-dir", action="append", type=Path, default=[], metavar="DIR",
                       help="extra directory with NAME.onnx + NAME.onnx.json voices")
        q.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")

    say = sub.add_parser("say", help="speak one text on the speaker or into a WAV file")
    say.add_argument("text", help="the text to speak ('-' reads standard input); bracket tags "
                     "like [pause 300ms], [rate 0.8], [voice NAME] work in it")
    say.add_argument("--ssml", action="store_true",
                     help="the text is SSML (<speak>, <break time=\"500ms\"/>, <prosody "
                     "rate>, <say-as>, ...)")
    say.add_argument("--voice", help="voice name (see `herald voices`)")
    say.add_argument("--speaker", help="speaker name or number of a multi-speaker voice")
    say.add_argument("--out", type=Path, metavar="FILE.wav", help="write a WAV file instead")
    say.add_argument("--length-scale", type=float, help="speaking rate: >1 slower, <1 faster")
    say.add_argument("--noise-scale", type=float, help="voice variation (voice default)")
    say.add_argument("--noise-w", type=float, help="rhythm variation (voice default)")
    say.add_argument("--gain", type=float, default=1.0, help="output gain (default 1.0)")
    say.add_argument("--device", help="sound device name or number (default: system default)")
    say.add_argument("--mqtt", metavar="HOST[:PORT]",
                     help="publish to a running daemon's `say` topic instead of speaking here")
    say.add_argument("--device-id", help="daemon's device id for --mqtt (default: hostname)")
    voice_args(say)

    voices = sub.add_parser("voices", help="list installed voices")
    voices.add_argument("--json", action="store_true", help="machine-readable output")
    voice_args(voices)

    bench = sub.add_parser("bench",
                           help="benchmark herald against piper-tts (same voice, same run)")
    bench.add_argument("--json", action="store_true", help="print one JSON object")
    bench.add_argument("--repeats", type=int, default=5, help="repetitions per figure")
    bench.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="thread counts")
    return p


def _cmd_voices(args: argparse.Namespace) -> int:
    import json

    catalog = VoiceCatalog(args.voice_dir)
    rows = [i.summary(i.name == catalog.default) for i in catalog.infos()]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'NAME':32} {'LANGUAGE':9} {'QUALITY':8} {'RATE':>6} {'SPEAKERS':>8}")
    for r in rows:
        star = " (default)" if r["default"] else ""
        print(f"{r['name']:32} {r['language']:9} {r['quality']:8} {r['sample_rate']:>6} "
              f"{r['speakers']:>8}{star}")
    return 0


def _cmd_say(args: argparse.Namespace) -> int:
    text = sys.stdin.read() if args.text == "-" else args.text
    if not text.strip():
        print("herald say: nothing to say (empty text)", file=sys.stderr)
        return 2
    if args.mqtt:
        from .say_remote import publish_say

        return publish_say(args.mqtt, args.device_id, text, args.voice,
                           text_format="ssml" if args.ssml else "text")
    set_threads(args.threads)
    # The composer, as the daemon speaks: sentences, bracket tags or SSML, other languages
    # by their own voice or espeak-ng. It checks the voice and the SSML before any synthesis.
    composer = Composer(VoiceCatalog(args.voice_dir))
    opts = SynthesisOptions(length_scale=args.length_scale, noise_scale=args.noise_scale,
                            noise_w=args.noise_w, speaker=args.speaker, gain=args.gain)
    chunks = composer.stream(text, "ssml" if args.ssml else "text", opts, args.voice)
    fmt = AudioFormat(chunks.sample_rate)
    t0 = time.monotonic()
    if args.out:
        pcm = b"".join(to_pcm16(c.samples) for c in chunks)
        args.out.write_bytes(wav_bytes(pcm, fmt))
        secs = len(pcm) / fmt.bytes_per_second
        log.info("wrote %s: %.2f s of audio in %.2f s", args.out, secs, time.monotonic() - t0)
        return 0
    import sounddevice as sd

    device = int(args.device) if args.device and args.device.isdigit() else args.device
    with sd.RawOutputStream(samplerate=fmt.rate, channels=1, dtype="int16", device=device) as out:
        for chunk in chunks:
            out.write(to_pcm16(chunk.samples))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "voices":
            return _cmd_voices(args)
        if args.command == "say":
            return _cmd_say(args)
        if args.command == "bench":
            from bench.engine import main as bench_main

            return bench_main(repeats=args.repeats, threads=args.threads, as_json=args.json)
        if args.command == "run":
            from .service import run

            return run(args.config, args.set + (["log_level=DEBUG"] if args.verbose else []))
    except (VoiceError, MarkupError) as e:
        print(f"herald: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 2


if __name__ == "__main__":
    sys.exit(main())
