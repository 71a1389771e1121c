"""A webhook receiver that verifies Standard Webhooks signatures (Python).

pip install "standardwebhooks>=1.1". The secret is the destination's OPTIONS["secret"]
("whsec_..."), shared with the receiver out of band. Run: python receiver.py
"""

import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

SECRET = os.environ.get("WEBHOOK_SECRET", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
# Keep these in your database, written in the same transaction as what you do with the
# payload (a table with a unique key for the ids, one row per ordering key):
seen_ids: set[str] = set()  # ids processed
keys: dict[str, tuple[str | None, int]] = {}  # ordering key -> (epoch, last sequence processed)
KNOWN_VERSION = 2  # the Outbox-Ordering-Version this receiver implements


def handle(body: bytes, headers: dict[str, str]) -> tuple[int, object]:
    """Verify one request; return (HTTP status, the payload, or None when not acted on).

    Webhook.verify checks the HMAC-SHA256 over "webhook-id.webhook-timestamp.body"
    against every signature in webhook-signature, and that the timestamp is within
    5 minutes of now (replay protection). It raises WebhookVerificationError otherwise.
    json_parse=False: it only verifies, so a body that is not JSON (the outbox sends
    bytes and text too) is accepted like any other; by default it would parse the body
    as JSON and raise JSONDecodeError on the others.
    """
    try:
        Webhook(SECRET).verify(body, headers, json_parse=False)
    except WebhookVerificationError:
        return 400, None  # a 4xx is permanent for the outbox: a forged request is not retried
    message_id = headers["webhook-id"]  # the same on every retry of one message
    order = ordering_of(headers)
    if order is not None:
        verdict = check_order(order, keys.get(order[0]))
        if verdict == "retry":
            return 409, None  # retried by the outbox: the key waits, nothing is skipped
        if verdict == "duplicate":
            return 200, None  # processed before (a retry after a crash): do nothing twice
        if message_id in seen_ids:
            # A requeue of a message processed before: the same id with a new sequence.
            # Do nothing twice, but take its sequence as the last one, or the key's next
            # message (previous: this sequence) would be refused for good.
            keys[order[0]] = (order[1], order[2])
            return 200, None
    elif message_id in seen_ids:
        return 200, None  # delivered before: acknowledge, do nothing twice
    try:
        payload = payload_of(body, headers)
    except ValueError:  # a JSON content type, but not JSON: permanent, not retried
        return 400, None
    # ... act on the payload, then record it (in the same database transaction) ...
    seen_ids.add(message_id)
    if order is not None:
        keys[order[0]] = (order[1], order[2])
    return 200, payload


def check_order(
    order: tuple[str, str | None, int, int | None, int], record: tuple[str | None, int] | None
) -> str:
    """ "process", "duplicate" (acknowledge, do not act) or "retry" (answer 409) for an
    ordered message, given this receiver's record of its key: (epoch, last sequence
    processed), or None (nothing processed yet).

    The epoch is the generation of the key at the outbox: a key whose state expired
    (ORDERING_KEY_TTL after it emptied) starts again at sequence 1 in a new epoch, so
    sequences are only compared within one epoch.
    """
    _key, epoch, seq, previous, version = order
    if version > KNOWN_VERSION:
        return "retry"  # headers this receiver may misread: wait for its upgrade
    if record is None:
        return "process"  # the first message of the key this receiver sees
    last_epoch, last = record
    # A new epoch: the key restarted, and its first message has no previous (one means we
    # missed some). Unless our record was written before the outbox sent epochs and this
    # message continues it (its previous is our last): the same life of the key.
    if epoch is not None and epoch != last_epoch and not (last_epoch is None and previous == last):
        return "retry" if previous is not None else "process"
    if seq <= last:
        return "duplicate"
    if previous is not None and previous != last:
        # The outbox delivered the message before this one (sequence `previous`), but
        # this receiver did not process it: its record of the key is behind. 409 is
        # retried by the outbox, so the key waits until you look.
        return "retry"
    return "process"


def ordering_of(headers: dict[str, str]) -> tuple[str, str | None, int, int | None, int] | None:
    """(ordering key, epoch or None, sequence, previous sequence or None, protocol
    version) of an ordered message, else None.

    The outbox sends one message of a key at a time, in order, with Outbox-Ordering-Key
    (percent-encoded), Outbox-Ordering-Sequence, Outbox-Ordering-Previous (the sequence of
    the message of the key delivered before it; absent when none was),
    Outbox-Ordering-Epoch (the key's generation, an opaque token: compare it for
    equality only) and Outbox-Ordering-Version (2; absent, with the epoch, on a message
    that joined its key before the outbox sent epochs: version 1). Cancelled and skipped
    messages leave gaps in the sequence, so compare `previous`, not `seq - 1`.
    """
    if "outbox-ordering-key" not in headers:
        return None
    previous = headers.get("outbox-ordering-previous")
    return (
        unquote(headers["outbox-ordering-key"]),
        headers.get("outbox-ordering-epoch") or None,
        int(headers["outbox-ordering-sequence"]),
        int(previous) if previous else None,
        int(headers.get("outbox-ordering-version") or 1),
    )


def payload_of(body: bytes, headers: dict[str, str]) -> object:
    """The decoded JSON for a JSON content type (application/json, or ...+json), else the raw bytes."""
    media_type = headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type == "application/json" or media_type.endswith("+json"):
        return json.loads(body)
    return body


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        status, payload = handle(body, {k.lower(): v for k, v in self.headers.items()})
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()
        if payload is not None:
            shown = f"{len(payload)} bytes" if isinstance(payload, bytes) else json.dumps(payload)
            print("received", self.headers["webhook-id"], shown)


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", 8001), Handler).serve_forever()
