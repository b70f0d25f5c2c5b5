"""herald's synthesis core: text in, audio chunks out. No network, no threads, no config files.

Nothing here imports ``daemon``.
"""

from .cpu import require_runnable_torch

# Before the first ``import torch``: a build this CPU cannot run would kill the process
# without a word (``tts.cpu``).
require_runnable_torch()

from .audio import AudioFormat, to_pcm16, wav_bytes  # noqa: E402
from .catalog import DEFAULT_VOICE, UnknownVoice, VoiceCatalog  # noqa: E402
from .stream import AudioChunk, SynthesisOptions, Synthesizer  # noqa: E402
from .threads import default_threads, set_threads  # noqa: E402
from .voice import Voice, VoiceError, VoiceInfo  # noqa: E402

__all__ = [
    "DEFAULT_VOICE", "AudioChunk", "AudioFormat", "SynthesisOptions", "Synthesizer",
    "UnknownVoice", "Voice", "VoiceCatalog", "VoiceError", "VoiceInfo", "default_threads",
    "set_threads", "to_pcm16", "wav_bytes",
]
