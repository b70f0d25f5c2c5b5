"""Local playback through sounddevice (PortAudio -> ALSA): ``sink`` plays, ``mixer`` fills
the device's blocks, ``device`` finds and opens the sound device. What the scheduler needs of
a speaker is ``daemon.sinks.protocol.Speaker``."""

from ..protocol import Speaker, SpeakerUnavailable
from .playback import PlaybackStats
from .sink import SpeakerSink

__all__ = ["PlaybackStats", "Speaker", "SpeakerSink", "SpeakerUnavailable"]
