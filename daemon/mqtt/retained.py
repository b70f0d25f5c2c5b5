"""Retained commands: refused, never executed, and each reported once.

A retained command would run again for every new subscription (every restart of herald with
a fresh session, every other herald on the same topics), so none is taken. Which deliveries
show up as retained depends on the protocol:

* MQTT 5 (herald's default) subscribes with *Retain As Published*, so a retained command
  keeps its flag on every delivery: live, queued in the persistent session while herald was
  away, and the broker's stored copy on a new subscription. *Retain Handling* 1 (send
  retained messages only for a new subscription) keeps a resumed session from getting the
  stored copy again on top of the queued one.
* MQTT 3.1.1 clears the flag on every delivery to an existing subscription: only the stored
  copy sent on (re)subscribing is recognisable; a retained command published live, or queued
  while herald was away, looks like any other and is executed.

The same stored message can still arrive more than once (3.1.1 resends it on every
resubscription), so a refusal is reported once per topic and payload; an empty retained
message (what clears one) is not a command and is ignored.
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict

log = logging.getLogger(__name__)

_REMEMBERED = 256


def refusal(topic: str) -> str:
    """What the error event says: why, and how to clear it."""
    return ("retained command refused, not executed: publish commands without the retain "
            "flag, and clear this one with an empty retained message (e.g. "
            f"mosquitto_pub -r -n -t '{topic}')")


class RetainedRefusals:
    """The retained messages already refused, by topic and payload."""

    def __init__(self) -> None:
        self._seen: OrderedDict[tuple[str, bytes], None] = OrderedDict()

    def first(self, topic: str, payload: bytes) -> bool:
        """True the first time this message is refused; False for a repeat, or for the
        empty message that clears a retained one (which also forgets the topic's)."""
        if not payload:
            for key in [k for k in self._seen if k[0] == topic]:
                del self._seen[key]
            log.debug("MQTT %s: empty retained message (clears a retained command): ignored",
                      topic)
            return False
        key = (topic, hashlib.blake2b(payload, digest_size=16).digest())
        if key in self._seen:
            log.debug("MQTT %s: retained command refused again (reported before)", topic)
            return False
        self._seen[key] = None
        while len(self._seen) > _REMEMBERED:
            self._seen.popitem(last=False)
        return True
