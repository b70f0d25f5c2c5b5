"""herald across a home: several heralds sharing one MQTT 5 broker.

Workers (``node.role = "worker"``, or ``all`` with ``fleet.enabled``) take synthesis jobs
from a shared subscription, so the broker balances them; satellites send the requests they
get as jobs and play the audio that comes back; a group announcement is synthesized once and
played by every member at the same moment. ``topics`` names every fleet topic, ``messages``
is the wire format, ``worker`` the worker's side.
"""
