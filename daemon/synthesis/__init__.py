"""Synthesis as the daemon runs it: the contracts the fronts and the scheduler rely on
(``contracts``, which import no torch, so a satellite stays torch-free), the engine that bridges
asyncio and the synthesizer, its worker threads, helper processes and deadline order."""
