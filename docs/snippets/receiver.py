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
seen_ids: set[str] = set()  # use a database table with a unique key in production
last_seq: dict[str, int] = {}  # ordering key -> last sequence processed (a table too)


def handle(body: bytes, headers: dict[str, str]) -> tuple[int, object]:
    """Verify one request; return (HTTP status, the payload or None).

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
    if message_id in seen_ids:
        return 200, None  # delivered before: acknowledge, do nothing twice
    order = ordering_of(headers)
    if order is not None:
        key, seq, previous = order
        done = last_seq.get(key)
        if done is not None and seq <= done:
            return 200, None  # processed before (a retry after a crash): do nothing twice
        if done is not None and previous is not None and previous != done:
            # The outbox delivered the message before this one (sequence `previous`), but
            # this receiver did not process it: its record of the key is behind. 409 is
            # retried by the outbox, so the key waits until you look.
            return 409, None
    try:
        payload = payload_of(body, headers)
    except ValueError:  # a JSON content type, but not JSON: permanent, not retried
        return 400, None
    seen_ids.add(message_id)
    if order is not None:
        last_seq[order[0]] = order[1]
    # ... act on the payload ...
    return 200, payload


def ordering_of(headers: dict[str, str]) -> tuple[str, int, int | None] | None:
    """(ordering key, sequence, previous sequence or None) of an ordered message, else None.

    The outbox sends one message of a key at a time, in order, with Outbox-Ordering-Key
    (percent-encoded), Outbox-Ordering-Sequence and Outbox-Ordering-Previous: the sequence
    of the message of the key delivered before it (absent when none was). Cancelled and
    skipped messages leave gaps in the sequence, so compare `previous`, not `seq - 1`.
    """
    if "outbox-ordering-key" not in headers:
        return None
    previous = headers.get("outbox-ordering-previous")
    return (
        unquote(headers["outbox-ordering-key"]),
        int(headers["outbox-ordering-sequence"]),
        int(previous) if previous else None,
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
