"""The HTTP front: ``app`` (routes, token guard, web page, /metrics), ``speech`` (/tts,
/tts/stream and what every synthesis route shares), ``openai`` (/v1/audio/speech), ``batch``
(/tts/batch), ``fields`` (reading and checking a request's fields)."""

from .app import HttpFront
from .settings import HttpSettings

__all__ = ["HttpFront", "HttpSettings"]
