"""The message list's page token (``?c=<token>``): where a page of a partitioned list
starts, for its "Previous" and "Next" links.

With more than one partition the list pages by position, not by number
(:func:`outbox.store.reads.queries.page_at`): a token says "the page right after (or right
before) this entry", the entry being its (score, id) in the list's index. It is signed
with Django's ``SECRET_KEY`` (:mod:`django.core.signing`: URL-safe base64 and an
HMAC), so a token that was changed, cut, or made up is refused as a whole, and it names
what the index's score means (``created``, ``updated``...), so a token of another list
is refused too. The list then shows its first page with a note and answers 400
(:mod:`outbox.admin_views.listing`). A valid token is only a position: reading from it
is read-only and costs the same wherever it points.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from django.core import signing

from outbox.store.indexes import Cursor

#: Separates this token's signatures from other uses of ``SECRET_KEY``.
SALT = "outbox.admin.message-list.page"
#: Longest token accepted (a real one is about 110 characters).
MAX_LENGTH = 300


@dataclass(frozen=True)
class PageToken:
    """A position in a partitioned message list.

    Attributes:
        cursor: (score as Redis wrote it, message id) of an entry of the list's index.
        backward: True for the page right before the entry, False for the one right after.
        scored: what the index's score means (:func:`outbox.store.reads.queries.score_field`,
            or ``"batch"``): the token belongs to lists of that index kind only.
    """

    cursor: Cursor
    backward: bool
    scored: str


def encode(token: PageToken) -> str:
    """The URL-safe text of ``token`` (signed; about 110 characters)."""
    score, member = token.cursor
    payload = ["p" if token.backward else "n", score.decode(), member.decode(), token.scored]
    return signing.dumps(payload, salt=SALT, compress=False)


def decode(text: str) -> PageToken:
    """The token ``text`` encodes.

    Raises:
        ValueError: ``text`` is not a token this site signed (changed, cut, made up, too
            long), or what it holds is not a position (a score that is not a finite number).
    """
    if len(text) > MAX_LENGTH:
        raise ValueError("page token too long")
    try:
        payload = signing.loads(text, salt=SALT)
    except (signing.BadSignature, ValueError, UnicodeError) as exc:
        raise ValueError("not a page token of this list") from exc
    if not (isinstance(payload, list) and len(payload) == 4 and all(isinstance(v, str) for v in payload)):
        raise ValueError("not a page token of this list")
    direction, score, member, scored = payload
    try:
        value = float(score)
    except ValueError:
        raise ValueError("page token without a score") from None
    if direction not in ("n", "p") or not math.isfinite(value) or not member:
        raise ValueError("not a page token of this list")
    return PageToken((score.encode(), member.encode()), direction == "p", scored)
