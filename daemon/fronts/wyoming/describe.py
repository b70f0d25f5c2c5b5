"""The ``info`` answer to ``describe``: one TTS program and the installed voices."""

from __future__ import annotations

import json
import logging

from wyoming.info import (
    Attribution,
    Info,
    TtsProgram,
    TtsVoice,
    TtsVoiceSpeaker,
)

from tts import (
    VoiceInfo,
)

from ...context import Context
from .protocol import PROGRAM

log = logging.getLogger("herald.wyoming")


def describe(ctx: Context, versions: dict[str, str]) -> Info:
    piper = Attribution(name="rhasspy (Piper voices)", url="https://github.com/rhasspy/piper")
    voices = []
    for v in ctx.engine.catalog.infos():
        c = v.config
        speakers = v.speakers or ([str(i) for i in range(c.num_speakers)]
                                  if c.num_speakers > 1 else [])
        voices.append(TtsVoice(
            name=v.name, description=f"{v.name} ({c.language}, {c.quality}, {c.sample_rate} Hz)",
            attribution=piper, installed=True, version=versions.get(v.name),
            languages=[c.language],
            speakers=[TtsVoiceSpeaker(name=s) for s in speakers] or None))
    program = TtsProgram(
        name=PROGRAM, description="herald: streaming text-to-speech, Piper voices on PyTorch",
        attribution=Attribution(name="herald", url=""),
        installed=True, version=ctx.version, voices=voices, supports_synthesize_streaming=True)
    return Info(tts=[program])


def voice_versions(infos: list[VoiceInfo]) -> dict[str, str]:
    """The Piper version each voice was exported with (its config says; the catalog doesn't)."""
    versions = {}
    for info in infos:
        try:
            version = json.loads(info.config_path.read_text(encoding="utf-8")).get(
                "piper_version")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(version, str):
            versions[info.name] = version
    return versions
