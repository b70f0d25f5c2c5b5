"""A request's life once a front has read it: what its fields mean (every front reads them
alike), the request itself, the scheduler's queue and utterances, the audio buffered ahead,
and what is reported of it (status, device state, the latency record and metrics)."""
