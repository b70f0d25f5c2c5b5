"""The MQTT plumbing the front and the fleet share: the connection to the broker, the topic
names, ``say`` and ``say/stream`` payloads, retained-command refusal, ``say/stream``
reassembly, the embedded broker and ``herald say --mqtt``."""
