"""Helpers (``tts.pieces.Helpers``) that decode what they are handed here, at once: the
lanes' scheduling and the pieces' joins without helper processes (``tests/test_helpers.py``
has the real ones)."""

from __future__ import annotations

import numpy as np

from tts.pieces import Helping, PieceJob
from tts.vits import Vits


class Done:
    """A piece a helper has decoded already."""

    def __init__(self, audio: list[tuple[np.ndarray, bool]]) -> None:
        self.audio = audio

    def claim(self) -> bool:
        return False

    def queued(self) -> bool:
        return False

    def take(self, wait: bool) -> list[tuple[np.ndarray, bool]]:
        got, self.audio = self.audio, []
        return got

    def cancel(self) -> None:
        pass


class Inline:
    """Helpers that decode every piece the moment it is handed to them, and keep the jobs
    they were handed."""

    def __init__(self, lanes: int) -> None:
        self.lanes = lanes
        self.handed: list[PieceJob] = []

    @property
    def offered(self) -> int:
        return len(self.handed)

    def decode(self, model: Vits, job: PieceJob) -> Helping:
        self.handed.append(job)
        return Done(list(job.decode(model, 32)))
