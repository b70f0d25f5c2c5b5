"""herald's synthesis core: text in, audio chunks out. No network, no threads, no config files.

Nothing here imports ``daemon``.
"""

from .audio import AudioFormat, to_pcm16, wav_bytes
from .catalog import DEFAULT_VOICE, UnknownVoice, VoiceCatalog
from .stream import AudioChunk, SynthesisOptions, Synthesizer
from .threads import default_threads, set_threads
from .voice import Voice, VoiceError, VoiceInfo

__all__ = [
    "DEFAULT_VOICE", "AudioChunk", "AudioFormat", "SynthesisOptions", "Synthesizer",
    "UnknownVoice", "Voice", "VoiceCatalog", "VoiceError", "VoiceInfo", "default_threads",
    "set_threads", "to_pcm16", "wav_bytes",
]
