"""Signing secrets of endpoints: generated or given per Standard Webhooks, rotated with
an overlap, encrypted at rest (``docs/webhooks.md``, "Secrets").

* A secret is ``whsec_`` + base64 of 24 to 64 random bytes (Standard Webhooks,
  https://www.standardwebhooks.com/, "Signature scheme"); :func:`generate_secret` makes
  one of 32 bytes from :func:`os.urandom`.
* An endpoint keeps a :class:`SecretSet`: its current secret and the secrets rotated out
  less than their overlap ago. Every request is signed with each of them (one
  ``v1,<signature>`` per secret, space-separated, as settings destinations sign with a
  list of secrets: :class:`~outbox.transports.webhook.WebhookTransport`), so a receiver
  holding either the old or the new secret verifies it during the overlap.
* The set is stored encrypted with ``cryptography``'s ``MultiFernet`` over
  ``OUTBOX["ENDPOINTS"]["SECRET_KEYS"]`` (Fernet keys: ``Fernet.generate_key()``): the
  first key encrypts, every key decrypts, so the encryption key itself rotates by
  putting a new key first and re-encrypting (:func:`reencrypt`), then dropping the old.

Nothing here puts a secret in an exception's text.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from dataclasses import dataclass, field
from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.core.exceptions import ImproperlyConfigured

from outbox.conf import endpoint_setting

SECRET_PREFIX = "whsec_"
MIN_SECRET_BYTES = 24  # Standard Webhooks: secrets of 24 to 64 bytes
MAX_SECRET_BYTES = 64
DEFAULT_SECRET_BYTES = 32


class SecretUnreadable(ImproperlyConfigured):
    """An endpoint's stored secrets cannot be decrypted with ``OUTBOX["ENDPOINTS"]
    ["SECRET_KEYS"]`` (a wrong or missing key), or no key is configured to encrypt with.
    Its deliveries wait (the endpoint is paused) instead of failing."""


def generate_secret(nbytes: int = DEFAULT_SECRET_BYTES) -> str:
    """A new secret: ``whsec_`` + base64 of ``nbytes`` random bytes (24 to 64).

    Raises:
        ValueError: ``nbytes`` out of range.
    """
    if not MIN_SECRET_BYTES <= nbytes <= MAX_SECRET_BYTES:
        raise ValueError(f"a secret has {MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} bytes, not {nbytes}")
    return SECRET_PREFIX + base64.b64encode(os.urandom(nbytes)).decode()


def check_secret(secret: object) -> str:
    """``secret`` if it is ``whsec_`` + base64 of 24 to 64 bytes.

    Raises:
        ValueError: otherwise; the text describes the value, never quotes it.
    """
    if not isinstance(secret, str) or not secret.startswith(SECRET_PREFIX):
        raise ValueError("a secret must be a str 'whsec_' + base64 of 24 to 64 bytes")
    encoded = secret[len(SECRET_PREFIX) :]
    try:
        key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(
            "a secret must be 'whsec_' + base64: it has characters base64 does not use"
        ) from None
    if not MIN_SECRET_BYTES <= len(key) <= MAX_SECRET_BYTES:
        raise ValueError(
            f"a secret decodes to {MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} bytes; this one to {len(key)}"
        )
    return secret


@dataclass(frozen=True)
class SecretSet:
    """An endpoint's secrets.

    Attributes:
        current: the secret signing from now on.
        previous: ``(secret, until)`` of secrets rotated out, ``until`` in epoch seconds:
            each signs beside ``current`` until then.
    """

    current: str = field(repr=False)
    previous: tuple[tuple[str, float], ...] = field(default=(), repr=False)

    def __repr__(self) -> str:
        """No secret: a debug page's or a reporter's frame locals print reprs."""
        return f"SecretSet(current='whsec_***', previous={len(self.previous)})"

    def signing(self, now: float) -> list[str]:
        """The secrets requests are signed with at ``now`` (epoch seconds): the current
        one first, then each previous one whose overlap has not ended."""
        return [self.current, *(s for s, until in self.previous if until > now)]

    def rotated(self, new: str, now: float, overlap: float) -> SecretSet:
        """This set after rotating to ``new``: the current secret signs ``overlap`` more
        seconds; previous secrets whose overlap ended are dropped."""
        kept = tuple((s, until) for s, until in self.previous if until > now)
        return SecretSet(new, ((self.current, now + overlap), *kept) if overlap > 0 else kept)

    def to_json(self) -> str:
        return json.dumps({"current": self.current, "previous": [list(p) for p in self.previous]})

    @classmethod
    def from_json(cls, text: str) -> SecretSet:
        data = json.loads(text)
        return cls(str(data["current"]), tuple((str(s), float(u)) for s, u in data.get("previous", ())))


@lru_cache(maxsize=4)
def _fernet(keys: tuple[str, ...]) -> MultiFernet:
    if not keys:
        raise SecretUnreadable(
            "OUTBOX['ENDPOINTS']['SECRET_KEYS'] is empty: endpoint secrets are encrypted at rest with these "
            "Fernet keys (generate one with cryptography.fernet.Fernet.generate_key())"
        )
    try:
        return MultiFernet([Fernet(k) for k in keys])
    except (ValueError, TypeError, binascii.Error) as exc:
        raise SecretUnreadable(
            "OUTBOX['ENDPOINTS']['SECRET_KEYS'] must be a list of Fernet keys "
            f"(32 url-safe base64-encoded bytes each): {type(exc).__name__}"
        ) from None


def fernet() -> MultiFernet:
    """The ``MultiFernet`` over ``OUTBOX["ENDPOINTS"]["SECRET_KEYS"]``.

    Raises:
        SecretUnreadable: no key, or a key that is not a Fernet key.
    """
    keys = endpoint_setting("SECRET_KEYS")
    if isinstance(keys, str):
        keys = [keys]
    if not isinstance(keys, (list, tuple)) or not all(isinstance(k, (str, bytes)) for k in keys):
        raise SecretUnreadable("OUTBOX['ENDPOINTS']['SECRET_KEYS'] must be a list of Fernet keys (str)")
    return _fernet(tuple(k.decode() if isinstance(k, bytes) else k for k in keys))


def encrypt(secrets: SecretSet) -> str:
    """The stored form of ``secrets``: a Fernet token (text) under the first key.

    Raises:
        SecretUnreadable: no usable key configured.
    """
    return fernet().encrypt(secrets.to_json().encode()).decode()


def decrypt(token: str) -> SecretSet:
    """The secrets stored as ``token``.

    Raises:
        SecretUnreadable: no configured key decrypts it (a wrong key, or the key that
            encrypted it was removed), or no usable key is configured.
    """
    try:
        return SecretSet.from_json(fernet().decrypt(token.encode()).decode())
    except InvalidToken:
        raise SecretUnreadable(
            "no key of OUTBOX['ENDPOINTS']['SECRET_KEYS'] decrypts this endpoint's secrets (a wrong key, or the "
            "key that encrypted them was removed before they were re-encrypted)"
        ) from None
    except (ValueError, KeyError, TypeError):
        raise SecretUnreadable("this endpoint's stored secrets are not readable (damaged)") from None


def reencrypt(token: str) -> str:
    """``token`` encrypted again under the first key (``MultiFernet.rotate``), for a
    rotation of ``SECRET_KEYS``.

    Raises:
        SecretUnreadable: as :func:`decrypt`.
    """
    try:
        return fernet().rotate(token.encode()).decode()
    except InvalidToken:
        raise SecretUnreadable(
            "no key of OUTBOX['ENDPOINTS']['SECRET_KEYS'] decrypts these secrets"
        ) from None
