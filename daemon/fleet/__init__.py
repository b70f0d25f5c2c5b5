"""herald across a home: several heralds sharing one MQTT 5 broker.

Workers (``node.role = "worker"``, or ``all`` with ``fleet.enabled``) take synthesis jobs
from a shared subscription, so the broker balances them; satellites send the requests they
get as jobs and play the audio that comes back; a group announcement is synthesized once and
played by every member at the same moment. ``topics`` names every fleet topic, ``messages``
is the wire format, ``link`` the node's connection, ``node`` builds a node's parts by role:
``worker`` the worker's side; ``voices`` the online workers' voices (what a satellite
resolves names with), ``pool`` the owner's side of a job, ``incoming`` and ``receiver`` the
player of the audio addressed to a node, ``groups`` a member's announcement groups.
"""
