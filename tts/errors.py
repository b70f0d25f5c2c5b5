"""The root of every error the synthesis core raises on purpose (a voice that cannot be read,
espeak-ng refusing a voice), apart from bugs, and the voice errors every caller tells apart.

Torch-free: a node without a model (a satellite) answers with the same errors."""

from __future__ import annotations


class TtsError(Exception):
    """An error of the synthesis core whose message is meant for the user."""


class VoiceError(TtsError):
    """A voice could not be read: wrong files, unknown layout, missing weights; or it has no
    such speaker."""


class UnknownVoice(VoiceError):
    """No installed voice matches the name or language asked for."""
