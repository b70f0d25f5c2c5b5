"""``herald run | say | voices | bench`` — the command line."""

from __future__ import annotations

import argparse
import asyncio
import atexit
import gc
import logging
import math
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast

from pydantic import BaseModel, TypeAdapter, ValidationError

# Torch-free parts only: `herald run` on a satellite never loads the model's code.
from tts.audio import AudioFormat, to_pcm16, wav_bytes
from tts.errors import VoiceError
from tts.memory import KEEP_WARM_MODES
from tts.options import SynthesisOptions
from tts.text import MarkupError

from . import __version__
from .errors import NOTHING_TO_SAY
from .settings import ConfigError, SynthesisSettings, VoicesSettings

if TYPE_CHECKING:
    from tts import VoiceCatalog
    from tts.compose import ComposedChunk

log = logging.getLogger("herald")


def _like_setting(model: type[BaseModel], name: str) -> Callable[[str], Any]:
    """An argparse ``type`` that takes what the config key ``name`` takes: one set of bounds
    for ``--noise-w`` and ``synthesis.noise_w``, refused with argparse's one-line error."""
    field = model.model_fields[name]
    adapter: TypeAdapter[Any] = TypeAdapter(cast(Any, Annotated[field.annotation, field]))

    def parse(text: str) -> Any:
        try:
            if not math.isfinite(float(text)):
                raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
        except ValueError:
            pass  # not a number at all: the adapter says what it wants
        try:
            return adapter.validate_python(text)
        except ValidationError as e:
            raise argparse.ArgumentTypeError(f"{e.errors()[0]['msg']} (got {text!r})") from None

    return parse


def _at_least_one(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return n


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="herald",
        description="Streaming text-to-speech daemon: MQTT, Wyoming and HTTP in, "
        "speaker or network audio out.",
    )
    p.add_argument("--version", action="version", version=f"herald {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    # Also after the command (`herald run -v`); SUPPRESS keeps `herald -v run` working.
    verbose = argparse.ArgumentParser(add_help=False)
    verbose.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                         help="debug logging")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser(
        "run", help="run the daemon (MQTT, Wyoming, HTTP)", parents=[verbose],
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

    def voice_dir(q: argparse.ArgumentParser) -> None:
        q.add_argument("--voice-dir", action="append", type=Path, default=[], metavar="DIR",
                       help="extra directory with NAME.onnx + NAME.onnx.json voices "
                       "(repeatable), besides the config's voices.directories")
        q.add_argument("--config", type=Path, metavar="FILE",
                       help="config whose [voices] directories and default are used (default: "
                       "./herald.toml or /etc/herald/herald.toml if present), as `run` reads; "
                       "for `say --mqtt`, whose device_id and mqtt.base_topic name the topics")

    threads = _like_setting(VoicesSettings, "threads")
    say = sub.add_parser(
        "say", help="speak one text on the speaker or into a WAV file", parents=[verbose],
        description="Speak TEXT here (the default sound device, or --out FILE.wav), or ask a "
        "running herald to speak it (--mqtt). Exit status: 0 spoken, 1 the daemon reported "
        "an error or a stop or did not answer, 2 bad input or no broker, 130 interrupted.")
    say.add_argument("text", help="the text to speak ('-' reads standard input); bracket tags "
                     "like [pause 300ms], [rate 0.8], [voice NAME] work in it")
    say.add_argument("--ssml", action="store_true",
                     help="the text is SSML (<speak>, <break time=\"500ms\"/>, <prosody "
                     "rate>, <say-as>, ...)")
    say.add_argument("--voice", help="voice name (see `herald voices`) or espeak:LANG, "
                     "e.g. espeak:de (default: en_US-joe-medium)")
    say.add_argument("--speaker", help="speaker name or number of a multi-speaker voice")
    say.add_argument("--out", type=Path, metavar="FILE.wav",
                     help="write a WAV file instead of playing")
    say.add_argument("--length-scale", type=_like_setting(SynthesisSettings, "length_scale"),
                     metavar="X", help="speaking rate, 0.25-4: >1 slower, <1 faster "
                     "(default: the voice's, usually 1)")
    say.add_argument("--noise-scale", type=_like_setting(SynthesisSettings, "noise_scale"),
                     metavar="X", help="voice variation, 0-2 (default: the voice's)")
    say.add_argument("--noise-w", type=_like_setting(SynthesisSettings, "noise_w"),
                     metavar="X", help="rhythm variation, 0-2 (default: the voice's)")
    say.add_argument("--gain", type=_like_setting(SynthesisSettings, "gain"), metavar="X",
                     help="output gain, above 0 and up to 10 (default 1.0)")
    say.add_argument("--device", help="sound device: a number or (part of) its name, as "
                     "speaker.device (default: the system default)")
    say.add_argument("--mqtt", metavar="HOST[:PORT]",
                     help="publish to a running daemon's `say` topic instead of speaking here "
                     "(port default 1883) and wait until it has spoken; --voice, --speaker, "
                     "--ssml, --length-scale, --noise-scale and --noise-w go with the request")
    say.add_argument("--device-id", help="daemon's device id for --mqtt (default: the "
                     "config's device_id, else the hostname); its topics follow the config's "
                     "mqtt.base_topic as the daemon's do")
    voice_dir(say)
    say.add_argument("--threads", type=threads, metavar="N",
                     help="cores to synthesize on, 1-64 (default: as many as there are, up to 4; "
                     "more, else 1)")

    voices = sub.add_parser(
        "voices", help="list installed voices, or those a catalog offers, and download them",
        parents=[verbose], formatter_class=argparse.RawDescriptionHelpFormatter,
        description="List the installed voices (the default), the voices Piper's catalog "
        "offers (--available), or download some (`herald voices download NAME...`).",
        epilog="examples:\n"
        "  herald voices --available --language de\n"
        "  herald voices download de_DE-thorsten-medium en_GB-alan-low\n"
        "a running herald picks a downloaded voice up by itself, without a restart")
    voices.add_argument("--json", action="store_true", help="machine-readable output")
    voices.add_argument("--available", action="store_true",
                        help="list what the voice catalog (voices.catalog_url) offers")
    voices.add_argument("--language", metavar="LANG",
                        help="with --available: only voices of this language (en, en_GB)")
    voice_dir(voices)
    actions = voices.add_subparsers(dest="action", metavar="ACTION")
    download = actions.add_parser(
        "download", help="download voices from the catalog into the voice directory",
        parents=[verbose],
        description="Download voices (name or alias, see --available) into the first "
        "--voice-dir, else the first of the config's voices.directories. Each file's size "
        "and MD5 are checked against the catalog; an interrupted download continues where "
        "it stopped when run again; a voice appears only once complete and verified. What "
        "a voice needs besides its files (Chinese pinyin voices: the g2pW model and its "
        "tokenizer) comes with it, from voices.resources_url, checked against pinned "
        "SHA-256 sums. Exit status: 0 all installed, 1 a download failed, 2 bad input.")
    download.add_argument("names", nargs="+", metavar="NAME", help="voice to download")
    # SUPPRESS: given before `download`, these keep the value `voices` parsed.
    download.add_argument("--voice-dir", action="append", type=Path, metavar="DIR",
                          default=argparse.SUPPRESS,
                          help="download into DIR (default: voices.directories[0])")
    download.add_argument("--config", type=Path, metavar="FILE", default=argparse.SUPPRESS,
                          help="config whose voices.directories, voices.catalog_url and "
                          "voices.resources_url are used (default: ./herald.toml or "
                          "/etc/herald/herald.toml)")

    bench = sub.add_parser("bench", parents=[verbose],
                           help="benchmark herald against piper-tts (same voice, same run)",
                           description="Time to first audio, real-time factor and peak memory "
                           "of herald and piper-tts with the same voice, measured in the same "
                           "run; it keeps the CPU busy while it runs. See bench/README.md.")
    bench.add_argument("--json", action="store_true", help="print one JSON object")
    bench.add_argument("--repeats", type=_at_least_one, default=5,
                       help="repetitions per figure (default 5)")
    bench.add_argument("--threads", type=threads, nargs="+", default=[1, 2], metavar="N",
                       help="core counts to measure at, 1-64 (default: 1 2): onnxruntime's "
                       "threads for piper-tts, herald's own thread and helper processes")
    bench.add_argument("--keep-warm", choices=KEEP_WARM_MODES, default="auto",
                       help="herald's voices.keep_warm, as in the daemon (default auto: keep "
                       "the voice's weights warm between requests where idle memory goes "
                       "cold, as on some VM hosts)")
    return p


def _catalog(args: argparse.Namespace) -> VoiceCatalog:
    """The voices the daemon would see with the same config, plus ``--voice-dir``: a voice
    added in ``voices.directories`` is listed and spoken here too. Raises ``ConfigError``."""
    from tts import VoiceCatalog

    from .settings import load_settings

    voices = load_settings(args.config).voices
    return VoiceCatalog([*voices.directories, *args.voice_dir], default=voices.default)


def _cmd_voices(args: argparse.Namespace) -> int:
    from .voices import commands as voice_commands

    if args.action == "download":
        return voice_commands.download(args)
    if args.available:
        return voice_commands.available(args)
    if args.language:
        print("herald voices: --language goes with --available", file=sys.stderr)
        return 2
    return voice_commands.installed(_catalog(args), args.json)


def _read_text(arg: str) -> str | None:
    """The text from the argument, or from standard input for ``-``; None (after saying
    why) when it is not UTF-8, which espeak-ng would otherwise fail on mid-synthesis."""
    if arg != "-":
        try:
            arg.encode("utf-8")  # undecodable argv bytes arrive as lone surrogates
        except UnicodeEncodeError:
            print("herald say: the text is not valid UTF-8 (check the terminal's locale)",
                  file=sys.stderr)
            return None
        return arg
    if sys.stdin.isatty():
        print("herald say: reading the text from standard input; end it with Ctrl-D",
              file=sys.stderr)
    data = sys.stdin.buffer.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        print(f"herald say: standard input is not valid UTF-8 (byte {e.start})",
              file=sys.stderr)
        return None


# Options that only mean something when herald speaks here, not when --mqtt asks a daemon.
_LOCAL_ONLY = {"out": "--out", "device": "--device", "voice_dir": "--voice-dir",
               "threads": "--threads", "gain": "--gain"}


def _cmd_say(args: argparse.Namespace) -> int:
    if args.mqtt:
        given = [flag for dest, flag in _LOCAL_ONLY.items() if getattr(args, dest)]
        if given:
            print(f"herald say: {', '.join(given)} cannot be used with --mqtt: the daemon "
                  "speaks with its own voices, device and settings", file=sys.stderr)
            return 2
    elif args.device_id:
        print("herald say: --device-id names the daemon to ask, so it needs --mqtt",
              file=sys.stderr)
        return 2
    text = _read_text(args.text)
    if text is None:
        return 2
    if not text.strip():
        print("herald say: nothing to say (empty text)", file=sys.stderr)
        return 2
    if args.mqtt:
        from .mqtt.say import publish_say
        from .settings import load_settings

        # The `say` fields for the options a request carries (None: the daemon's defaults).
        fields = {k: v for k, v in (("speaker", args.speaker), ("rate", args.length_scale),
                                    ("noise_scale", args.noise_scale),
                                    ("noise_w", args.noise_w)) if v is not None}
        try:  # the daemon's own settings: its topics are derived from them as it does
            settings = load_settings(args.config)
        except ConfigError as e:
            print(f"herald say: config error: {e}", file=sys.stderr)
            return 2
        return publish_say(args.mqtt, settings, args.device_id, text, args.voice,
                           text_format="ssml" if args.ssml else "text", fields=fields)
    from tts import default_threads, prepare_process
    from tts.compose import Composer

    from .synthesis.helpers import HelperPool

    prepare_process()
    # The composer, as the daemon speaks: sentences, bracket tags or SSML, other languages
    # by their own voice or espeak-ng. It checks the voice and the SSML before any synthesis.
    catalog = _catalog(args)
    composer = Composer(catalog)
    opts = SynthesisOptions(length_scale=args.length_scale, noise_scale=args.noise_scale,
                            noise_w=args.noise_w, speaker=args.speaker,
                            gain=1.0 if args.gain is None else args.gain)
    helpers = None
    lanes = args.threads or default_threads()
    label = composer.known_voice(args.voice) if args.voice else catalog.default
    if lanes > 1 and label is not None and label in {i.name for i in catalog.infos()}:
        catalog.synthesizer(label)  # loaded before the helpers fork: they share its weights
        helpers = HelperPool(catalog, lanes - 1)
    chunks = composer.stream(text, "ssml" if args.ssml else "text", opts, args.voice,
                             helpers=helpers, whole=args.out is not None)
    fmt = AudioFormat(chunks.sample_rate)
    if args.out:
        return _write_wav(args.out, chunks, fmt)
    return asyncio.run(_play(chunks, fmt, args.device))


def _write_wav(path: Path, chunks: Iterator[ComposedChunk], fmt: AudioFormat) -> int:
    """Synthesize into ``path``. The file is opened first, so an unwritable path is refused
    before the work; a file that was there stays as it was if synthesis fails or is cut."""
    existed = path.exists()
    try:
        f = path.open("ab")  # checks that it can be written, without truncating
    except OSError as e:
        print(f"herald say: cannot write {path}: {e.strerror}", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    pcm = b""
    try:
        with f:
            pcm = b"".join(to_pcm16(c.samples) for c in chunks)
            if pcm:
                if f.seekable():  # not a pipe (--out /dev/stdout | aplay)
                    f.truncate(0)
                f.write(wav_bytes(pcm, fmt))
    except OSError as e:  # the disk filled up, ...
        print(f"herald say: cannot write {path}: {e.strerror}", file=sys.stderr)
        return 2
    finally:
        if not pcm and not existed:
            path.unlink(missing_ok=True)
    if not pcm:
        print(f"herald say: {NOTHING_TO_SAY}", file=sys.stderr)
        return 2
    secs = len(pcm) / fmt.bytes_per_second
    log.info("wrote %s: %.2f s of audio in %.2f s", path, secs, time.monotonic() - t0)
    return 0


async def _play(chunks: Iterator[ComposedChunk], fmt: AudioFormat, device: str | None) -> int:
    """Play on the sound device through the daemon's speaker sink: the same device lookup
    (a number or part of a name; a wrong one lists the devices), resampling for devices
    that don't take the voice's rate, and a fade-out on Ctrl-C. Synthesis runs in a thread,
    ahead of playback."""
    from .jobs.metrics import Metrics
    from .settings import SpeakerSettings
    from .sinks.speaker import SpeakerSink, SpeakerUnavailable

    first = await asyncio.to_thread(next, chunks, None)
    if first is None:
        print(f"herald say: {NOTHING_TO_SAY}", file=sys.stderr)
        return 2

    async def pcm() -> AsyncIterator[bytes]:
        chunk: ComposedChunk | None = first
        while chunk is not None:
            yield to_pcm16(chunk.samples)
            chunk = await asyncio.to_thread(next, chunks, None)

    # A device that fails to open: the error line below says so (the sink's own line speaks
    # for the daemon, "retrying in 10 s, other outputs keep working").
    sink = SpeakerSink(SpeakerSettings(device=device), Metrics(), retries=False)
    try:
        await sink.play(fmt, pcm())
    except SpeakerUnavailable as e:
        print(f"herald say: {e}; or write a file with --out FILE.wav", file=sys.stderr)
        return 2
    finally:
        await sink.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    # Registered first, so it runs last: the interpreter's teardown collects garbage over
    # every object torch's import made (some 180,000; a full pass takes ~80 ms here, and
    # the teardown makes several: 0.5 s of it). They live as long as the process anyway, so
    # they are left out, and ``herald say`` or a stopped daemon ends that much sooner.
    atexit.register(gc.freeze)
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

            return bench_main(repeats=args.repeats, threads=args.threads, as_json=args.json,
                              keep_warm=args.keep_warm)
        if args.command == "run":
            from .service import run

            return run(args.config, args.set + (["log_level=DEBUG"] if args.verbose else []))
    except (VoiceError, MarkupError, ConfigError) as e:
        print(f"herald: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 2


if __name__ == "__main__":
    sys.exit(main())
