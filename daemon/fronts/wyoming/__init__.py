"""The Wyoming front: Home Assistant's text-to-speech protocol, over TCP or a Unix socket.

``front`` listens; ``connection`` is one client's connection (the protocol rules are described
there); ``output`` sends a request's audio; ``protocol`` holds the refusals and event checks;
``describe`` answers ``describe``; ``announce`` is the zeroconf announcement."""

from ...settings import WyomingSettings
from .front import WyomingFront

__all__ = ["WyomingFront", "WyomingSettings"]
