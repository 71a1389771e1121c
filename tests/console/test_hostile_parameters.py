"""The console under hostile parameters (issue 20, item 9): a page number of 10**30, a
"since" before year 1, ``as_of=nan``... get the last page or a 400, never a 5xx; and a
Redis error that is not an outage is never reported as "Redis is unavailable".

Against the real admin and Redis: eight threads, each with its own signed-in test client,
firing bad combinations at once, with messages in two destinations (so lists are merged
in Redis, ``lua/lib/merge.lua``).
"""

from __future__ import annotations

import itertools
import threading
import urllib.parse

import pytest
from django.db import connections
from django.test import Client
from redis.exceptions import ResponseError

from outbox.conf import outbox_settings
from outbox.store.client.outages import REDIS_UNAVAILABLE
from outbox.store.reads import queries
from tests.support.console import make, u

pytestmark = pytest.mark.django_db(transaction=True)

THREADS = 8
HUGE = ["10000000000000000000", str(10**30), "9" * 400]
#: Query strings of the message list, each with a page number past any last page.
HOSTILE_LIST = [
    "p={p}",
    "status=failed&p={p}",
    "destination=mem&p={p}",
    "created_from=1&created_to=9999999999&p={p}",
    "error_class=http&p={p}",
    "status_code=500&p={p}",
    "queue=default&p={p}",
    "batch=" + "a" * 32 + "&p={p}",
    "o=-created&p={p}",
    "status=pending&o=next_attempt&p={p}",
]


@pytest.mark.skipif(
    outbox_settings.partitions > 1,
    reason="numbered pages are the list of one partition; with more it pages by Previous/Next "
    "(tests/console/test_partitioned_list.py)",
)
def test_a_page_past_the_end_of_a_merged_list_is_the_last_page(superuser_client, repo):
    """The issue's reproduction: messages in two destinations and ``p=10**19`` answered
    503 "Redis is unavailable: ResponseError: value is not an integer or out of range"."""
    make(repo, 60, "failed", "mem")
    make(repo, 3, "failed", "hook")
    for p in HUGE:
        response = superuser_client.get(u("message_list"), {"p": p})
        assert response.status_code == 200, (p, response.status_code)
        html = response.content.decode()
        assert "There is no such page; this is the last page, 2." in html
        assert response.context["page_number"] == 2
        assert len(response.context["rows"]) == 13  # 63 messages, 50 a page
        assert "Redis is unavailable" not in html


def test_a_page_past_the_end_of_an_empty_list_is_page_one(superuser_client, repo):
    response = superuser_client.get(u("message_list"), {"status": "cancelled", "p": HUGE[1]})
    assert response.status_code == 200
    assert response.context["page_number"] == 1 and response.context["rows"] == []


def test_a_query_past_the_end_never_asks_redis_for_that_rank(repo):
    make(repo, 2, "failed", "mem")
    make(repo, 2, "failed", "hook")
    found = queries.page(repo, queries.MessageFilter(), offset=10**30, limit=10**30)
    assert (found.ids, found.total) == ([], 4)


def test_recover_since_before_1970_and_a_non_finite_as_of_are_not_5xx(superuser_client, repo):
    make(repo, 2, "failed", "mem")
    path = u("destination_recover", "mem")
    # Before 1970 is "since the beginning": the confirmation counts both.
    response = superuser_client.post(path, {"since": "-1e11"})
    assert response.status_code == 200 and response.context["count"] == 2
    for as_of in ("nan", "inf", "-inf", "1e400", "abc"):
        response = superuser_client.post(path, {"since": "-1e11", "as_of": as_of, "post": "yes"})
        assert response.status_code == 400, as_of
        assert "nothing was changed" in response.content.decode()
    assert repo.count("failed", "mem") == 2


def test_only_an_outage_is_reported_as_redis_unavailable(superuser_client, repo):
    """A Redis error that is not an outage (here WRONGTYPE: a key holding what the console
    does not expect) is a bug: Django's 500, logged, not a 503 blaming Redis's reachability."""
    (m,) = make(repo, 1, "failed", "mem")
    repo.connection.set(repo.keys.of(m.id).status("failed", "mem"), "not a sorted set")
    assert not issubclass(ResponseError, REDIS_UNAVAILABLE)
    superuser_client.raise_request_exception = False
    response = superuser_client.get(u("message_list"), {"status": "failed", "destination": "mem"})
    assert response.status_code == 500
    assert b"Redis is unavailable" not in response.content


def hostile_requests(live_url: str) -> list[tuple[str, str, dict[str, str] | None]]:
    """(method, URL, form) of bad parameter combinations over every console page, the
    URLs under ``live_url`` ("" for the test client)."""
    list_url = live_url + u("message_list")
    requests: list[tuple[str, str, dict[str, str] | None]] = [
        ("GET", f"{list_url}?{q.format(p=p)}", None) for q, p in itertools.product(HOSTILE_LIST, HUGE)
    ]
    requests += [
        ("GET", f"{list_url}?p={p}", None) for p in ("-1", "0", "1e5", "abc", "1" * 5000, "%00", "½")
    ]
    requests += [
        ("GET", f"{list_url}?{q}", None)
        for q in (
            "created_from=nan&p=2",
            "created_from=-1e11",
            "updated_to=1e400&status=failed",
            "status_code=99999999999999999999",
            "q=" + "x" * 3000,
            "o=" + "-" * 100,
            "batch=%00",
        )
    ]
    dashboard = live_url + u("dashboard")
    requests += [("GET", f"{dashboard}?chart={c}", None) for c in ("x" * 3000, "%00", "{p1}", "mem")]
    requests += [
        ("GET", live_url + u("destination", "mem"), None),
        ("GET", live_url + u("destination", "x" * 300), None),
        ("GET", live_url + u("message_detail", "msg_" + "9" * 300), None),
        ("GET", live_url + u("message_body", "{p1}x"), None),
        ("GET", live_url + u("message_action_status", "x" * 128), None),
    ]
    recover = live_url + u("destination_recover", "mem")
    for since, as_of in itertools.product(("-1e11", "1e300", "nan", "0001-01-01", ""), ("nan", "1e400", "x")):
        requests.append(("POST", recover, {"since": since, "as_of": as_of}))
        requests.append(("POST", recover, {"since": since, "as_of": as_of, "post": "yes"}))  # 400: as_of
    action = live_url + u("message_action")
    for p, as_of in itertools.product(("p", "created_from", "status_code"), ("nan", "-1e11", "1e400")):
        requests.append(
            ("POST", action, {"action": "requeue", "select_across": "1", p: HUGE[1], "as_of": as_of})
        )
    return requests


def test_concurrent_hostile_requests_never_answer_5xx(superuser_client, superuser, repo):
    """Eight threads fire every bad combination (three rounds) at the admin at once, each
    with its own signed-in test client (and database connection)."""
    make(repo, 60, "failed", "mem")
    make(repo, 5, "failed", "hook")
    make(repo, 5, "pending", "hook")
    clients = []
    for _ in range(THREADS):  # signed in here: the threads only read the sessions
        client = Client(raise_request_exception=False)
        client.force_login(superuser)
        clients.append(client)
    requests = hostile_requests("") * 3
    answers: list[tuple[int, str]] = []

    def fire(client: Client, chunk: list[tuple[str, str, dict[str, str] | None]]) -> None:
        try:
            for method, target, form in chunk:
                target = urllib.parse.quote(target, safe=":/?&=%")
                response = client.get(target) if form is None else client.post(target, form)
                answers.append((response.status_code, f"{method} {target[:200]} {form}"))
        finally:
            connections.close_all()  # this thread's connection

    threads = [
        threading.Thread(target=fire, args=(client, requests[i::THREADS])) for i, client in enumerate(clients)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert len(answers) == len(requests)
    failures = [(status, what) for status, what in answers if status >= 500]
    assert failures == []
    assert {status for status, _ in answers} <= {200, 302, 400, 404}
    assert repo.count("failed", "mem") == 60  # no hostile confirmation changed anything
