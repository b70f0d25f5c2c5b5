"""The root of every error the daemon raises on purpose, so a caller can catch "herald said
no" (a bad request, a bad setting, a front that cannot start) apart from a bug."""

from __future__ import annotations


class HeraldError(Exception):
    """An error of the daemon layer whose message is meant for the user."""
