"""A tiny ASGI Django project for ``test_uvicorn.py`` (issue 33's "Done when"): the test
suite's settings (Redis from ``OUTBOX_TEST_REDIS_URL``), this module as the URLconf, and
two async views: ``/send?n=&chunk=&pause=`` stores ``n`` messages with ``outbox.asend``
(``chunk`` concurrent tasks at a time, ``pause`` seconds between chunks) and answers how
many it stored and how many it had to send again; ``/health`` answers at once.

    DJANGO_SETTINGS_MODULE=tests.integrations.uvicorn_app uvicorn tests.integrations.uvicorn_app:application
"""

from __future__ import annotations

import asyncio
import json

from tests.settings import *  # noqa: F403  (the suite's settings, then this project's URLconf)

ROOT_URLCONF = "tests.integrations.uvicorn_app"


async def send(request):  # type: ignore[no-untyped-def]
    from django.http import HttpResponse

    import outbox

    n, chunk = int(request.GET.get("n", 1000)), int(request.GET.get("chunk", 50))
    pause = float(request.GET.get("pause", 0))
    again = 0

    async def one(i: int) -> str:
        """asend, and after an unknown outcome asend_again until it is known (stored once)."""
        nonlocal again
        try:
            return (await outbox.asend("mem", {"i": i})).id
        except outbox.SendOutcomeUnknown as exc:
            pending = exc.unknown
        except outbox.OutboxUnavailable:  # nothing was stored: the same call again
            await asyncio.sleep(0.2)
            return await one(i)
        while True:
            again += 1
            await asyncio.sleep(0.2)
            try:
                return (await outbox.asend_again(pending))[0].id
            except (outbox.SendOutcomeUnknown, outbox.OutboxUnavailable):
                continue

    ids: list[str] = []
    for start in range(0, n, chunk):
        ids += await asyncio.gather(*(one(i) for i in range(start, min(n, start + chunk))))
        await asyncio.sleep(pause)
    return HttpResponse(json.dumps({"ids": ids, "again": again}), content_type="application/json")


async def health(request):  # type: ignore[no-untyped-def]
    from django.http import HttpResponse

    return HttpResponse("ok")


def _urls() -> list:  # type: ignore[type-arg]
    from django.urls import path

    return [path("send", send), path("health", health)]


urlpatterns = _urls()


def _application():  # type: ignore[no-untyped-def]
    import gc
    import os

    from django.core.asgi import get_asgi_application

    application = get_asgi_application()
    if os.environ.get("OUTBOX_TEST_GC_FREEZE"):  # the tuned row of benchmarks.bench_async (docs/async.md)
        gc.collect()
        gc.freeze()
    return application


application = _application()
