"""The HTTP front: ``front`` (routes, token guard, web page, /metrics), ``speech`` (/tts,
/tts/stream and what every synthesis route shares), ``openai`` (/v1/audio/speech), ``batch``
(/tts/batch), ``fields`` (reading and checking a request's fields), ``formats`` (the audio
formats answers come in, and server-sent events)."""

from ...settings import HttpSettings
from .front import HttpFront

__all__ = ["HttpFront", "HttpSettings"]
