"""The root of every error the synthesis core raises on purpose (a voice that cannot be read,
espeak-ng refusing a voice), apart from bugs."""

from __future__ import annotations


class TtsError(Exception):
    """An error of the synthesis core whose message is meant for the user."""
