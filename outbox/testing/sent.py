"""The messages sent during a test: :class:`SentMessages`."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from asgiref.sync import sync_to_async

from outbox.records import Message
from outbox.store import get_repository
from outbox.store.reads.inspection import ids_since


class SentMessages:
    """The messages sent since this object was made (or since :meth:`reset`), read from
    Redis and from the capture table (messages sent inside a transaction that has not
    committed, such as a test wrapped in one by pytest-django or ``TestCase``).

    Reads happen when asked (``len()``, iteration, the assertions), so it sees what was
    sent up to that moment, with its current delivery status. Order: by creation time.

    Example::

        sent = SentMessages()
        place_order(...)
        sent.assert_sent("orders", count=1, body={"order": 7})
        assert sent.to("orders")[0].status == "pending"
    """

    def __init__(self) -> None:
        self.since = time.time()

    def reset(self) -> None:
        """Forget what was sent so far."""
        self.since = time.time()

    def messages(self) -> list[Message]:
        """Every message sent since :attr:`since`, oldest first."""

        repo = get_repository()
        ids = ids_since(repo, self.since)
        found: dict[str, Message] = {m.id: m for m in repo.get_many(ids) if m is not None}
        for message in _captured_since(self.since):
            found.setdefault(message.id, message)
        return sorted(found.values(), key=lambda m: (m.created_at, m.id))

    def to(self, destination: str) -> list[Message]:
        """The messages sent to ``destination``, oldest first."""
        return [m for m in self.messages() if m.destination == destination]

    def __len__(self) -> int:
        return len(self.messages())

    def __iter__(self) -> Iterator[Message]:
        return iter(self.messages())

    def __getitem__(self, index: int) -> Message:
        return self.messages()[index]

    def assert_sent(
        self,
        destination: str,
        *,
        count: int | None = None,
        body: Any = None,
        headers: dict[str, str] | None = None,
    ) -> list[Message]:
        """Assert that messages went to ``destination``.

        Args:
            destination: the destination name.
            count: exactly this many matching messages (default: at least one).
            body: only messages whose body equals this: a ``dict``/``list`` is compared
                with the body parsed as JSON, ``str`` with the text, ``bytes`` with the bytes.
            headers: only messages carrying these headers (others may be present too).

        Returns:
            The matching messages.

        Raises:
            AssertionError: with what was sent instead.
        """
        matching = [m for m in self.to(destination) if _matches(m, body, headers)]
        if (count is None and not matching) or (count is not None and len(matching) != count):
            want = "at least one" if count is None else str(count)
            sent = [(m.destination, m.text[:80]) for m in self.messages()]
            raise AssertionError(
                f"expected {want} message(s) to {destination!r}"
                + (f" with body {body!r}" if body is not None else "")
                + (f" with headers {headers!r}" if headers else "")
                + f", found {len(matching)}; sent: {sent}"
            )
        return matching

    def assert_nothing_sent(self, destination: str | None = None) -> None:
        """Assert that no message was sent (to ``destination``, or at all).

        Raises:
            AssertionError: listing what was sent.
        """
        sent = self.to(destination) if destination else self.messages()
        if sent:
            where = f" to {destination!r}" if destination else ""
            raise AssertionError(
                f"expected no message{where}, found {len(sent)}: {[(m.destination, m.text[:80]) for m in sent]}"
            )

    # In async tests: the same, read in Django's thread for synchronous code (the capture
    # table is read with the ORM, which raises SynchronousOnlyOperation on an event loop).

    async def amessages(self) -> list[Message]:
        """:meth:`messages` for async tests: ``await outbox_sent.amessages()``."""
        return await sync_to_async(self.messages, thread_sensitive=True)()

    async def aassert_sent(
        self,
        destination: str,
        *,
        count: int | None = None,
        body: Any = None,
        headers: dict[str, str] | None = None,
    ) -> list[Message]:
        """:meth:`assert_sent` for async tests: ``await outbox_sent.aassert_sent("orders")``."""
        check = sync_to_async(self.assert_sent, thread_sensitive=True)
        return await check(destination, count=count, body=body, headers=headers)

    async def aassert_nothing_sent(self, destination: str | None = None) -> None:
        """:meth:`assert_nothing_sent` for async tests."""
        await sync_to_async(self.assert_nothing_sent, thread_sensitive=True)(destination)


def _matches(message: Message, body: Any, headers: dict[str, str] | None) -> bool:
    if headers and any(message.headers.get(k) != v for k, v in headers.items()):
        return False
    if body is None:
        return True
    if isinstance(body, bytes):
        return message.body == body
    if isinstance(body, str):
        return message.text == body
    try:
        return bool(message.json() == body)
    except ValueError:
        return False


def _captured_since(since: float) -> list[Message]:
    """Messages in the capture tables created since ``since`` (a database this test may
    not use, or without the table, has none)."""
    from outbox.models import CapturedMessage  # Django models: `import outbox.testing` must not load them
    from outbox.sending.capture import (
        relay_databases,  # capture imports Django models: `import outbox.testing` must not
    )

    out = []
    for alias in relay_databases():
        try:
            rows = list(CapturedMessage.objects.using(alias).filter(created_at__gte=since - 0.001))
        except Exception:  # no access to this database in this test, or no table
            continue
        out += [Message.from_capture_json(row.record, row.body) for row in rows]
    return out
