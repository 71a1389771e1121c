"""The message record's wire format (outbox/store/codec.py): what message_value writes is
read back as it was given, whatever came before it in the process. Its header line after
the destination is kept for the next call (a fan-out writes a thousand deliveries that
differ only in destination): a kept line must never serve a message it does not match."""

from __future__ import annotations

import threading
import time

from outbox.records import Message
from outbox.store.codec import message_header, message_value


def _message(destination: str, headers: dict | None = None, key: str | None = None, created=None) -> Message:
    return Message(
        id="msg_x",
        destination=destination,
        body=b'{"n":1}',
        content_type="application/json",
        created_at=created if created is not None else 1_795_900_000.25,
        headers=headers or {},
        idempotency_key=key,
    )


def _round_trip(m: Message) -> dict:
    fields = message_header(message_value(m))
    assert fields["destination"] == m.destination and fields["body"] == m.body
    assert fields.get("headers", {}) == m.headers and fields.get("idempotency_key") == m.idempotency_key
    assert fields["created_at"] == m.created_at and fields["content_type"] == m.content_type
    return fields


def test_each_record_reads_back_as_given_whatever_came_before():
    headers = {"webhook-id": "evt_1", "odd": 'é"\n\\'}
    for m in [
        _message("endpoint:a", headers),
        _message("endpoint:b", headers),  # the kept line
        _message("endpoint:c", {"webhook-id": "evt_2"}),  # other headers
        _message("endpoint:d", {"webhook-id": "evt_2"}, key="k"),  # and a key
        _message("endpoint:e", None, key="k"),  # a key, no headers
        _message("hook"),  # the plain header
        _message("endpoint:f", headers, created=1_795_900_001.5),  # another time
        _message('quo"te', headers),
    ]:
        _round_trip(m)


def test_headers_changed_after_a_write_are_written_as_they_are_now():
    headers = {"webhook-id": "evt_1"}
    _round_trip(_message("endpoint:a", headers))
    headers["webhook-id"] = "evt_2"  # the caller's dict, changed in place
    assert _round_trip(_message("endpoint:b", headers))["headers"] == {"webhook-id": "evt_2"}


def test_threads_writing_different_headers_never_mix_them():
    errors: list[str] = []

    def write(n: int) -> None:
        for i in range(2_000):
            m = _message(f"endpoint:{n}", {"webhook-id": f"evt_{n}"}, created=time.time())
            fields = message_header(message_value(m))
            if fields["headers"] != {"webhook-id": f"evt_{n}"} or fields["destination"] != m.destination:
                errors.append(f"{n}/{i}: {fields}")

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
