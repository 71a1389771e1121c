"""A worker loads the configurations of the endpoints a claim names together
(EndpointCache.preload): one query for all of them, each copy as get() would make it."""

from __future__ import annotations

import time

import pytest

from outbox import webhooks
from outbox.destinations.config import endpoint_cache, get_transport
from outbox.endpoint_names import endpoint_destination
from outbox.exceptions import EndpointUnavailable, UnknownDestination

pytestmark = pytest.mark.django_db(transaction=True)

URL = "https://93.184.215.14/hook"


def test_a_claim_s_endpoints_are_loaded_in_one_query(django_assert_num_queries):
    app = webhooks.create_application("acme")
    live = [webhooks.create_endpoint(app, URL + f"/{i}").endpoint for i in range(5)]
    off = webhooks.disable_endpoint(webhooks.create_endpoint(app, URL + "/off").endpoint)
    gone = endpoint_destination("0" * 32)
    names = [e.destination for e in live] + [off.destination, gone, "hook"]
    endpoint_cache.clear()
    with django_assert_num_queries(2):  # the claim's endpoints, then their application's others
        endpoint_cache.preload(names)
    with django_assert_num_queries(0):
        for e in live:
            assert get_transport(e.destination).url == e.url  # type: ignore[attr-defined]
        with pytest.raises(EndpointUnavailable, match="disabled"):
            get_transport(off.destination)
        with pytest.raises(UnknownDestination):
            get_transport(gone)
        endpoint_cache.preload(names)  # all kept: nothing to read


def test_an_application_s_endpoints_are_loaded_with_the_first_a_claim_names(
    django_assert_num_queries, monkeypatch
):
    """A published event fans out to an application's endpoints and a worker's claims meet
    them a few at a time: the first claim's preload loads the application's other
    enabled endpoints too (one query more, once per application and CACHE_TTL), so the
    claims after it read nothing; not a disabled one, nor another application's, and at
    most SIBLINGS_MOST of them."""
    from outbox.destinations import config

    def kept(name: str) -> bool:
        return endpoint_cache._fresh(name, time.monotonic(), 30)

    acme = webhooks.create_application("acme")
    other = webhooks.create_application("other")
    live = [webhooks.create_endpoint(acme, URL + f"/{i}").endpoint for i in range(8)]
    off = webhooks.disable_endpoint(webhooks.create_endpoint(acme, URL + "/off").endpoint)
    theirs = webhooks.create_endpoint(other, URL + "/theirs").endpoint
    endpoint_cache.clear()
    with django_assert_num_queries(2):
        endpoint_cache.preload([live[0].destination])
    with django_assert_num_queries(0):
        for i in range(1, 8, 2):  # the next claims, two endpoints each
            endpoint_cache.preload(
                [live[i].destination, live[i + 1].destination] if i + 1 < 8 else [live[i].destination]
            )
        for e in live:
            assert get_transport(e.destination).url == e.url  # type: ignore[attr-defined]
    assert not kept(off.destination)  # disabled: loaded when a delivery of it is met
    assert not kept(theirs.destination)  # another application's
    with django_assert_num_queries(2):  # another application: its endpoint, then its others
        endpoint_cache.preload([theirs.destination, live[0].destination])
    assert kept(theirs.destination)
    endpoint_cache.clear()
    monkeypatch.setattr(config, "SIBLINGS_MOST", 3)
    endpoint_cache.preload([live[0].destination])
    assert kept(live[0].destination) and sum(kept(e.destination) for e in live) == 1 + 3
