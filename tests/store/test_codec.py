"""The message record's wire format (outbox/store/codec.py): what message_value writes is
read back as it was given, whatever came before it in the process, and its header line is
byte for byte the JSON encoder's, whether it took the encoder or wrote plain text itself
(its kept starts of lines, per destination and content type, must never serve another)."""

from __future__ import annotations

import json
import threading
import time

from hypothesis import given, settings
from hypothesis import strategies as st

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
        _message("endpoint:b", headers),
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


def _encoded(m: Message) -> bytes:
    """The header line as json.dumps writes it (what every reader parses)."""
    fields = {"destination": m.destination, "content_type": m.content_type, "created_at": m.created_at}
    if m.headers:
        fields["headers"] = m.headers
    if m.idempotency_key:
        fields["idempotency_key"] = m.idempotency_key
    return json.dumps(fields, separators=(",", ":")).encode() + b"\n" + m.body


_text = st.one_of(  # printable ASCII ('"' and '\\' too), then anything (control, non-ASCII, surrogates)
    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=12),
    st.text(max_size=8),
)


@settings(max_examples=400, deadline=None)
@given(
    destination=_text,
    content_type=st.sampled_from(["application/json", "text/plain; charset=utf-8", 'a/b; q="x\\y"']),
    headers=st.dictionaries(_text, _text, max_size=3),
    key=st.one_of(st.none(), _text),
    created=st.one_of(
        st.floats(allow_nan=False, allow_infinity=False, min_value=0, max_value=4e9),
        st.sampled_from([float("inf"), 1_795_900_000]),  # the encoder's fallbacks: not finite, an int
    ),
)
def test_the_header_line_is_the_json_encoders_byte_for_byte(destination, content_type, headers, key, created):
    m = Message(
        id="msg_x",
        destination=destination,
        body=b"\x00{body}\n",
        content_type=content_type,
        created_at=created,
        headers=headers,
        idempotency_key=key,
    )
    assert message_value(m) == _encoded(m)
    assert message_value(m) == _encoded(m)  # the second from the kept start of its line
