"""The embedded broker: with no ``mqtt.host`` configured, herald brings its own.

So ``herald run`` works on a fresh machine: amqtt serves MQTT 3.1.1 on 127.0.0.1 (loopback
only; anonymous access is fine there) inside herald's own event loop. It keeps nothing across
restarts; a home with other MQTT devices should run Mosquitto and set ``mqtt.host``.
"""

from __future__ import annotations

import errno
import logging
import socket
from typing import Any

log = logging.getLogger(__name__)

HOST = "127.0.0.1"


class BrokerError(Exception):
    """The embedded broker could not start; the message says what to do."""


def port_in_use(port: int, host: str = HOST) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return True
            raise
    return False


class EmbeddedBroker:
    name = "broker"

    def __init__(self, port: int) -> None:
        self.port = port
        self._broker: Any = None

    async def start(self) -> None:
        if port_in_use(self.port):
            raise BrokerError(
                f"cannot start the embedded MQTT broker: {HOST}:{self.port} is already in use "
                "(another broker?); herald will try to connect to it. Set mqtt.host to use "
                "that broker on purpose, or mqtt.port to run the embedded one elsewhere")
        for name in ("amqtt", "transitions"):  # per-packet chatter at INFO
            logging.getLogger(name).setLevel(logging.WARNING)
        from amqtt.broker import Broker

        config = {
            "listeners": {"default": {"type": "tcp", "bind": f"{HOST}:{self.port}"}},
            "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin":
                        {"allow_anonymous": True}},
        }
        self._broker = Broker(config)
        try:
            await self._broker.start()
        except Exception as e:
            self._broker = None
            raise BrokerError(f"the embedded MQTT broker failed to start on {HOST}:{self.port}: "
                              f"{e}") from e
        log.info("embedded MQTT broker (MQTT 3.1.1) listening on %s:%d; set mqtt.host to use "
                 "your own broker", HOST, self.port)

    async def stop(self) -> None:
        if self._broker is not None:
            broker, self._broker = self._broker, None
            await broker.shutdown()
