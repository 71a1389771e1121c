"""The metrics endpoint: the outbox collector in Prometheus's exposition format.

Who may read it:

* a request with ``Authorization: Bearer <token>`` where ``<token>`` is
  ``OUTBOX["METRICS_TOKEN"]`` (a str, or a list of str while rotating): what a
  Prometheus scrape job sends with ``authorization: {credentials: <token>}``;
* a logged-in, active staff user (to look at it in a browser).

Anyone else gets 401 (with ``WWW-Authenticate: Bearer``) or, logged in without staff
status, 403. The format follows the ``Accept`` header (OpenMetrics when asked for, else
the text format 0.0.4), as ``prometheus_client``'s own handlers choose it.
"""

from __future__ import annotations

import hmac
import threading

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry

from outbox.conf import outbox_settings
from outbox.metrics.collector import OutboxCollector

_registry: CollectorRegistry | None = None
_registry_lock = threading.Lock()


def metrics_registry() -> CollectorRegistry:
    """The registry the view serves: the outbox collector alone (built once per process)."""
    global _registry
    with _registry_lock:
        if _registry is None:
            registry = CollectorRegistry(auto_describe=False)
            registry.register(OutboxCollector())
            _registry = registry
        return _registry


def configured_tokens() -> list[str]:
    """``OUTBOX["METRICS_TOKEN"]`` as a list ([] when unset).

    Raises:
        ImproperlyConfigured: the setting is neither None, a non-empty str, nor a
            non-empty list of non-empty str.
    """

    value = outbox_settings.METRICS_TOKEN
    if value is None:
        return []
    tokens = [value] if isinstance(value, str) else value
    if (
        not isinstance(tokens, (list, tuple))
        or not tokens
        or not all(isinstance(t, str) and t for t in tokens)
    ):
        raise ImproperlyConfigured(
            "OUTBOX['METRICS_TOKEN'] must be None, a non-empty str or a list of them "
            f"(not a {type(value).__name__})"
        )
    return list(tokens)


def _bearer(request: HttpRequest) -> str | None:
    scheme, _, credentials = request.headers.get("Authorization", "").partition(" ")
    return credentials.strip() if scheme.lower() == "bearer" and credentials.strip() else None


def allowed(request: HttpRequest) -> bool:
    """True if ``request`` may read the metrics (see the module docstring).

    Raises:
        ImproperlyConfigured: ``OUTBOX["METRICS_TOKEN"]`` is not a valid value.
    """
    tokens = configured_tokens()  # first: a wrong setting is an error on every request
    given = _bearer(request)
    # compare_digest on bytes: constant time for equal lengths, no TypeError for non-ASCII
    if given is not None and any(hmac.compare_digest(given.encode(), t.encode()) for t in tokens):
        return True
    user = getattr(request, "user", None)
    return bool(user is not None and user.is_active and user.is_staff)


@never_cache
@require_safe
def metrics(request: HttpRequest) -> HttpResponse:
    """GET/HEAD: the outbox metrics (``text/plain; version=0.0.4`` or OpenMetrics).

    Returns 200 even when Redis is unreachable (``outbox_up 0``); 401/403 for a
    request that may not read them.
    """
    if not allowed(request):
        user = getattr(request, "user", None)
        if user is not None and user.is_authenticated:
            return HttpResponse("forbidden: staff users only\n", status=403, content_type="text/plain")
        response = HttpResponse("authentication required\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="outbox metrics"'
        return response
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    return HttpResponse(encoder(metrics_registry()), content_type=content_type)
