"""Local playback through sounddevice (PortAudio -> ALSA): ``sink`` plays, ``mixer`` fills
the device's blocks, ``device`` finds and opens the sound device; ``protocol`` is what the
scheduler needs of a speaker."""

from .device import SpeakerUnavailable
from .playback import PlaybackStats, SpeakerSettings
from .protocol import Speaker
from .sink import SpeakerSink

__all__ = ["PlaybackStats", "Speaker", "SpeakerSettings", "SpeakerSink", "SpeakerUnavailable"]
