"""Email through Django's mail framework (``django.core.mail``).

Options:

* ``to`` (list of str, required unless every message sets a ``To`` header): recipients,
  ``"a@example.com"`` or ``"Name <a@example.com>"``.
* ``from_email`` (str): sender; ``DEFAULT_FROM_EMAIL`` when absent.
* ``subject`` (str): subject when the message has no ``Subject`` header (default "Notification").
* ``mailer`` (str, Django 6.1+): an alias of Django's ``MAILERS`` setting; the default
  mailer when absent and no ``backend`` is given. Its host, port, credentials and timeout
  come from that ``MAILERS`` entry.
* ``backend`` (str): dotted path of an email backend class, built by the transport; when
  absent, ``EMAIL_BACKEND``'s class in a project without ``MAILERS``. The SMTP backend
  takes its host, port and credentials from Django's ``EMAIL_*`` settings.
* ``timeout`` (seconds): the socket timeout given to an SMTP backend the transport builds;
  default ``EMAIL_TIMEOUT`` (a project without ``MAILERS``), or :data:`DEFAULT_TIMEOUT`
  (10 s) when that is None (Django's default: no timeout at all). A ``MAILERS`` entry sets
  its own.
* ``deadline`` (seconds, default 3 x ``timeout``): the hard limit of one attempt. The
  email is sent from a thread that is given up (a retryable failure) when the deadline
  passes, so a server that answers one byte at a time cannot hold a worker. System
  check ``outbox.W003`` compares it with half of ``VISIBILITY_TIMEOUT``.

The body is the message body as UTF-8 text; ``text/html`` content is sent as HTML.
Message headers ``To`` (comma-separated) and ``Subject`` override the options; other
headers become email headers, and ``X-Outbox-Message-Id`` carries the message id.

Outcomes: an SMTP server's permanent (5xx) refusal of every recipient, of the sender or
of the message data fails the message at once; a transient (4xx) refusal, such as
greylisting's 450/451 on ``RCPT``, and connection or network errors are retried.
"""

from __future__ import annotations

import contextlib
import smtplib
import warnings
from collections.abc import Iterator
from email.utils import getaddresses
from typing import Any

from django.conf import settings
from django.core import mail
from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.core.mail import EmailMessage
from django.core.mail.backends.smtp import EmailBackend as SMTPBackend
from django.core.validators import validate_email
from django.utils.module_loading import import_string

from outbox.exceptions import DeliveryError, InvalidMessage
from outbox.records import Message
from outbox.redaction import redact, secrets_for
from outbox.transports.base import DeliveryResult, Transport, positive_seconds
from outbox.transports.deadlines import call_with_deadline

DEFAULT_TIMEOUT = 10.0  # seconds of SMTP socket timeout when EMAIL_TIMEOUT is None

#: Django 6.1's mail API: ``MAILERS`` aliases (``django.core.mail.mailers``); the ``EMAIL_*``
#: settings, ``get_connection()`` and ``EmailMessage(connection=...)`` are deprecated there
#: (RemovedInDjango2028Warning), so the transport uses them only on older Django.
MAILERS: Any = getattr(mail, "mailers", None)  # django.core.mail.mailers on Django 6.1+
HAS_MAILERS = MAILERS is not None


def mailers_configured() -> bool:
    """True when this Django has ``MAILERS`` and the project defines it (Django 6.1+)."""
    return HAS_MAILERS and hasattr(settings, "MAILERS")


@contextlib.contextmanager
def legacy_mail_api() -> Iterator[None]:
    """For a project without ``MAILERS``: read its ``EMAIL_*`` settings and build its
    ``EMAIL_BACKEND`` as Django before 6.1 did. Django 6.1 deprecates both and warns on
    every use (RemovedInDjango2028Warning, "Migrate to MAILERS"); the project's own
    settings are what Django asks to migrate, so the transport honours them without a
    warning per attempt pointing at the outbox. With ``MAILERS`` defined nothing is hidden.
    """
    with warnings.catch_warnings():
        if not mailers_configured():
            warnings.filterwarnings(
                "ignore",
                message=r"(The EMAIL_\w+ setting is deprecated|Directly creating \w+ instances is deprecated)",
            )
        yield


def legacy_setting(name: str) -> Any:
    """An ``EMAIL_*`` setting of a project without ``MAILERS`` (see :func:`legacy_mail_api`)."""
    with legacy_mail_api():
        return getattr(settings, name, None)


def _bad_address(address: Any) -> bool:
    """True unless ``address`` is one valid email address (optionally with a display name)."""
    if not isinstance(address, str) or "\r" in address or "\n" in address:
        return True
    parsed = getaddresses([address])
    if len(parsed) != 1 or not parsed[0][1]:
        return True
    try:
        validate_email(parsed[0][1])
    except ValidationError:
        return True
    return False


def _split_addresses(value: str) -> list[str]:
    """The addresses of a comma-separated ``To`` header value."""
    return [a.strip() for a in value.split(",") if a.strip()]


def _plain_text(value: Any, where: str) -> str:
    if not isinstance(value, str) or "\r" in value or "\n" in value:
        raise ImproperlyConfigured(f"{where} must be a str on one line, not {value!r}")
    return value


def _smtp_error(exc: smtplib.SMTPException) -> DeliveryError:
    """A :class:`DeliveryError` for an SMTP exception: permanent when the server said 5xx to this message."""
    if isinstance(exc, smtplib.SMTPRecipientsRefused):
        refused = exc.recipients or {}
        codes = [code for code, _ in refused.values()]
        detail = "; ".join(
            f"{address}: {code} {reply.decode(errors='replace') if isinstance(reply, bytes) else reply}"
            for address, (code, reply) in refused.items()
        )
        permanent = bool(codes) and all(500 <= code < 600 for code in codes)
        return DeliveryError(f"SMTP recipients refused: {detail}", permanent=permanent)
    if isinstance(exc, (smtplib.SMTPSenderRefused, smtplib.SMTPDataError)):
        reply = (
            exc.smtp_error.decode(errors="replace")
            if isinstance(exc.smtp_error, bytes)
            else str(exc.smtp_error)
        )
        what = "sender refused" if isinstance(exc, smtplib.SMTPSenderRefused) else "message refused"
        return DeliveryError(f"SMTP {what}: {exc.smtp_code} {reply}", permanent=500 <= exc.smtp_code < 600)
    # Connection-level trouble (greeting, HELO, authentication, disconnects): retry.
    return DeliveryError(f"{type(exc).__name__}: {exc}")


class EmailTransport(Transport):
    """Sends each message as one email (see the module docstring).

    Raises:
        ImproperlyConfigured: from ``__init__``, for invalid options.
    """

    options = ("to", "from_email", "subject", "mailer", "backend", "timeout", "deadline")

    def __init__(self, destination: str, **options: Any) -> None:
        super().__init__(destination, **options)
        where = f"destination {destination!r}"
        to = options.get("to", [])
        if not isinstance(to, (list, tuple)) or any(_bad_address(a) for a in to):
            raise ImproperlyConfigured(
                f"{where}: OPTIONS['to'] must be a list of email addresses, not {to!r}"
            )
        self.to = list(to)
        self.from_email = options.get("from_email")
        if self.from_email is not None and _bad_address(self.from_email):
            raise ImproperlyConfigured(
                f"{where}: OPTIONS['from_email'] must be an email address, not {self.from_email!r}"
            )
        self.subject = _plain_text(options.get("subject", "Notification"), f"{where}: OPTIONS['subject']")
        self.backend = options.get("backend")
        if self.backend is not None:
            if not isinstance(self.backend, str):
                raise ImproperlyConfigured(
                    f"{where}: OPTIONS['backend'] must be a dotted path, not {self.backend!r}"
                )
            try:
                import_string(self.backend)
            except ImportError as exc:
                raise ImproperlyConfigured(
                    f"{where}: OPTIONS['backend'] {self.backend!r} cannot be imported: {exc}"
                ) from exc
        self.mailer = options.get("mailer")
        if self.mailer is not None:
            if not HAS_MAILERS:
                raise ImproperlyConfigured(f"{where}: OPTIONS['mailer'] needs Django 6.1 or later (MAILERS)")
            if self.backend is not None:
                raise ImproperlyConfigured(f"{where}: give OPTIONS['mailer'] or OPTIONS['backend'], not both")
            if not isinstance(self.mailer, str) or self.mailer not in MAILERS:
                known = ", ".join(sorted(MAILERS)) or "none"
                raise ImproperlyConfigured(
                    f"{where}: OPTIONS['mailer'] {self.mailer!r} is not an alias of MAILERS (known: {known})"
                )
        legacy_timeout = None if mailers_configured() else legacy_setting("EMAIL_TIMEOUT")
        default_timeout = legacy_timeout or DEFAULT_TIMEOUT
        self.timeout = positive_seconds(
            options.get("timeout", default_timeout), f"{where}: OPTIONS['timeout']"
        )
        self.deadline = positive_seconds(
            options.get("deadline", 3 * self.timeout), f"{where}: OPTIONS['deadline']"
        )

    def longest_attempt(self) -> float:
        """The ``deadline`` option (seconds)."""
        return self.deadline

    def connection(self) -> Any:
        """An email backend instance: the ``backend`` option's class (an SMTP backend, or a
        subclass, gets ``timeout``), else the ``mailer`` (Django 6.1+ with ``MAILERS``:
        ``mailers[alias]``, the default mailer when no alias is given), else the class of
        ``EMAIL_BACKEND`` (a project without ``MAILERS``)."""
        if self.backend is None and (self.mailer or mailers_configured()):
            return MAILERS[self.mailer or "default"]
        with legacy_mail_api():
            backend_class = import_string(self.backend or legacy_setting("EMAIL_BACKEND"))
            if issubclass(backend_class, SMTPBackend):
                return backend_class(timeout=self.timeout)
            return backend_class()  # fail_silently defaults to False

    def check_message(self, body: bytes, content_type: str, headers: dict[str, str]) -> None:
        """Refuse, at ``send()`` time, a message that cannot become an email.

        Raises:
            InvalidMessage: no recipient (no ``to`` option and no ``To`` header), a ``To``
                header without valid addresses, or a body that is not UTF-8.
        """
        to_headers = [v for k, v in headers.items() if k.lower() == "to"]
        if to_headers:
            addresses = _split_addresses(to_headers[0])
            if not addresses or any(_bad_address(a) for a in addresses):
                raise InvalidMessage(
                    f"the 'To' header must list email addresses separated by commas, not {to_headers[0]!r}",
                    field="headers",
                )
        elif not self.to:
            raise InvalidMessage(
                f"destination {self.destination!r} has no OPTIONS['to']: give a 'To' header", field="headers"
            )
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidMessage("an email body must be UTF-8 text", field="body") from exc

    def deliver(self, message: Message) -> DeliveryResult:
        """Send the message as one email.

        Returns:
            A :class:`DeliveryResult` whose ``detail`` counts the recipients.

        Raises:
            DeliveryError: the backend failed; permanent for 5xx refusals (see the module docstring).
        """
        headers = dict(message.headers)
        to = self.to
        subject = self.subject
        for key in list(headers):
            if key.lower() == "to":
                to = _split_addresses(headers.pop(key))
            elif key.lower() == "subject":
                subject = headers.pop(key)
        headers.setdefault("X-Outbox-Message-Id", message.id)
        secrets = secrets_for(message.headers, None)
        try:
            email = EmailMessage(
                subject=subject,
                body=message.text,
                from_email=self.from_email,
                to=to,
                headers=headers,
            )
            if message.content_type.split(";")[0].strip().lower() == "text/html":
                email.content_subtype = "html"
            connection = self.connection()
            sent = call_with_deadline(
                lambda: connection.send_messages([email]),
                self.deadline,
                f"sending the email to {self.destination!r}",
            )
        except smtplib.SMTPException as exc:
            error = _smtp_error(exc)
            raise DeliveryError(redact(str(error), secrets=secrets), permanent=error.permanent) from exc
        except DeliveryError:
            raise
        except OSError as exc:
            raise DeliveryError(redact(f"{type(exc).__name__}: {exc}", secrets=secrets)) from exc
        except ValueError as exc:  # an address or header Django cannot encode: sending again cannot help
            raise DeliveryError(
                redact(f"cannot build the email: {type(exc).__name__}: {exc}", secrets=secrets),
                permanent=True,
            ) from exc
        if not sent:
            raise DeliveryError("the email backend reported 0 messages sent")
        return DeliveryResult(detail=f"sent to {len(to)} recipient(s)")
