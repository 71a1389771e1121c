"""A worker loads the configurations of the endpoints a claim names together
(EndpointCache.preload): one query for all of them, each copy as get() would make it."""

from __future__ import annotations

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
    with django_assert_num_queries(1):
        endpoint_cache.preload(names)
    with django_assert_num_queries(0):
        for e in live:
            assert get_transport(e.destination).url == e.url  # type: ignore[attr-defined]
        with pytest.raises(EndpointUnavailable, match="disabled"):
            get_transport(off.destination)
        with pytest.raises(UnknownDestination):
            get_transport(gone)
        endpoint_cache.preload(names)  # all kept: nothing to read
