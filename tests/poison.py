"""A callable destination for fault tests: records each delivery in a file (one message id
a line, so a worker in another process can be checked) and kills its process
(``os._exit(1)``) on a message whose body is ``{"poison": true}``."""

import os


def record(message) -> None:
    body = message.json()
    if isinstance(body, dict) and body.get("poison"):
        os._exit(1)
    path = os.environ.get("OUTBOX_TEST_DELIVERY_LOG")
    if path:
        with open(path, "a") as f:
            f.write(message.id + "\n")


def crash_or_record(message) -> None:
    """As :func:`record`, after a moment's work (so a batch's attempts are all in flight
    together when the poison ends its process): 50 ms for an ordinary message, 20 ms
    for the poison."""
    import time

    body = message.json()
    poison = isinstance(body, dict) and body.get("poison")
    time.sleep(0.02 if poison else 0.05)
    record(message)
