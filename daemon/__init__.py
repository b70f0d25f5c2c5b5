"""herald's daemon: everything that talks to the world. Imports ``tts``, never the reverse."""

__version__ = "0.1.0"
