"""Local playback through sounddevice (PortAudio -> ALSA): see ``sink`` for how it works."""

from .sink import PlaybackStats, SpeakerSettings, SpeakerSink, SpeakerUnavailable

__all__ = ["PlaybackStats", "SpeakerSettings", "SpeakerSink", "SpeakerUnavailable"]
