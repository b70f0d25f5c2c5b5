"""A request's life once a front has read it: the request itself, the scheduler's queue and
utterances, the audio buffered ahead, and what is reported of it (status, device state,
the latency record and metrics)."""
