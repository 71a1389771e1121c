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
