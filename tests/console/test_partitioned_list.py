"""The message list, its counts and bulk actions by filter with messages in 16 partitions:
on the single test server (with ``OUTBOX_TEST_PARTITIONS=16``, or the ``partitioned``
fixture here) and on the real 3-primary cluster (``cluster_mode``), where every script
call must stay in one hash slot. Pages by cursor (next / previous) give the exact list
order, with no duplicate and no gap, in both directions."""

from __future__ import annotations

import random
import time

import pytest
from redis.cluster import RedisCluster

import outbox
from outbox.operations.operation import CANCEL, REQUEUE, Selection, execute
from outbox.records import Status, partition_of
from outbox.store import get_repository
from outbox.store.indexes import IndexRange
from outbox.store.reads import merged_pages, queries
from outbox.store.reads.queries import MessageFilter, TimeRange
from outbox.store.repository import Change
from tests.support.console import listed_ids, text_of, u

pytestmark = pytest.mark.django_db(transaction=True)  # send() writes at once (no atomic block)

PARTITIONS = 16


def send_spread(
    n: int, destinations=("mem", "hook"), status: str = "pending", seed: int = 3, key: str = "k"
) -> list:
    """``n`` messages over ``destinations`` and every partition (idempotency keys pick
    the partitions), created at distinct and some equal times; ``status`` as the index
    says. Returns the messages, in the order sent."""
    repo = get_repository()
    rng = random.Random(seed)
    sent = outbox.send_many(
        [
            {
                "destination": destinations[i % len(destinations)],
                "body": {"n": i},
                "idempotency_key": f"{key}{i}",
            }
            for i in range(n)
        ]
    )
    if status != Status.PENDING.value:
        now = time.time()
        fields = {"last_error": "HTTP 500", "last_status_code": "500"} if status == "failed" else {}
        # some equal scores: ties across partitions are ordered by id
        changes = [
            Change(
                id=m.id,
                from_statuses=("pending",),
                to=status,
                score=now - rng.choice([0, i]) * 1e-3,  # in the past: bulk actions stop at now
                set=dict(fields),
            )
            for i, m in enumerate(sent)
        ]
        assert all(r.applied for r in repo.transition(changes, now))
    assert len({partition_of(m.id) for m in sent}) == min(n, PARTITIONS) or n < 40
    return sent


def expected(repo, status: str | None, destination: str | None = None, descending=True) -> list[str]:
    """The list in index order, read key by key (ZRANGE WITHSCORES of every sorted set)."""
    rows = []
    for key in repo.index(status, destination).keys:
        rows += repo.connection.zrange(key, 0, -1, withscores=True)
    rows.sort(key=lambda r: (r[1], r[0]), reverse=descending)
    return [raw.decode() for raw, _ in rows]


def walk(repo, flt, limit, descending=True, **options):
    """Every page forward from the first by its next cursor, then back by previous."""
    pages = [queries.page_at(repo, flt, limit=limit, descending=descending, **options)]
    while pages[-1].next is not None:
        pages.append(
            queries.page_at(repo, flt, cursor=pages[-1].next, limit=limit, descending=descending, **options)
        )
    back = [pages[-1]]
    while back[-1].previous is not None:
        back.append(
            queries.page_at(
                repo,
                flt,
                cursor=back[-1].previous,
                backward=True,
                limit=limit,
                descending=descending,
                **options,
            )
        )
    return pages, back[::-1]


def test_index_keys_group_by_partition(spread):
    send_spread(40)
    groups = spread.index("pending").by_slot()
    assert len(groups) == PARTITIONS  # the destinations of one partition share its slot
    for group in groups:
        assert len({k.split("}")[0] for k in group}) == 1


@pytest.mark.parametrize("descending", [True, False])
def test_pages_forward_and_back_give_the_exact_order(spread, descending):
    send_spread(130)
    want = expected(spread, None, descending=descending)
    forward, backward = walk(spread, MessageFilter(), 25, descending=descending)
    ids = [i for p in forward for i in p.ids]
    assert ids == want  # no duplicate, no gap, the order of one sorted set
    assert [len(p.ids) for p in forward] == [25] * 5 + [5]
    assert [p.ids for p in backward] == [p.ids for p in forward]  # previous retraces them
    assert forward[0].previous is None and forward[-1].next is None
    assert forward[2].total == 130 and forward[2].exact


def test_status_and_destination_filters_with_ties(spread):
    send_spread(90, status="failed")
    for destination in (None, "hook"):
        flt = MessageFilter(status="failed", destination=destination)
        forward, backward = walk(spread, flt, 7)
        assert [i for p in forward for i in p.ids] == expected(spread, "failed", destination)
        assert [p.ids for p in backward] == [p.ids for p in forward]
    assert queries.page(spread, MessageFilter(status="failed", destination="hook"), limit=0).total == 45


def test_offset_pages_merge_partitions(spread):
    send_spread(60)
    want = expected(spread, None)
    for offset in (0, 13, 50, 59, 60, 10**9):
        assert (
            queries.page(spread, MessageFilter(), offset=offset, limit=11).ids == want[offset : offset + 11]
        )


def test_a_bounded_scan_is_per_partition_with_one_budget(spread):
    sent = send_spread(120, status="failed")
    flt = MessageFilter(status="failed", queue="outbox")  # checked id by id: a scan
    want = expected(spread, "failed")
    forward, backward = walk(spread, flt, 9, scan_limit=40)
    assert [i for p in forward for i in p.ids] == want
    assert all(p.scanned <= 40 for p in forward)  # the limit is for all partitions together
    # back: pages end where the budget does, so their edges differ from the forward ones';
    # only the first page, read afresh when less than a page is left before, may repeat rows
    assert list(dict.fromkeys(i for p in backward for i in p.ids)) == want
    page = queries.page(spread, flt, limit=10, scan_limit=40)
    assert page.ids == want[: len(page.ids)] and not page.exact and page.scanned <= 40
    whole = queries.page(spread, flt, limit=200)
    assert (whole.ids, whole.total, whole.exact) == (want, len(sent), True)
    none = queries.page_at(spread, MessageFilter(status="failed", queue="other"), limit=10)
    assert none.ids == [] and none.next is None


def test_counts_are_one_round_per_node(spread):
    send_spread(40)
    assert spread.count("pending") == 40
    assert spread.count_range(spread.index(None), 0, time.time() + 1) == 40
    assert queries.count_matching(spread, MessageFilter(destination="mem"), ["pending"]).n == 20


def test_bulk_requeue_by_filter_touches_every_partition(spread):
    sent = send_spread(80, status="failed")
    cancelled = send_spread(10, destinations=("hook",), seed=5, key="c")
    selection = Selection(filter=MessageFilter(status="failed", destination="mem"), as_of=time.time() + 1)
    assert selection.count(spread, REQUEUE).n == 40
    result = execute(spread, REQUEUE, selection)
    assert (result.acted, result.skipped) == (40, 0)
    mem = [m.id for m in sent if m.destination == "mem"]
    assert len({partition_of(i) for i in mem}) > 8
    assert {outbox.get(i).status for i in mem} == {"pending"}
    assert {outbox.get(m.id).status for m in sent if m.destination == "hook"} == {"failed"}
    # a filter no index serves (a queue) walks every partition too
    result = execute(spread, CANCEL, Selection(filter=MessageFilter(queue="outbox"), as_of=time.time() + 1))
    assert result.acted == 40 + len(cancelled)
    assert {outbox.get(m.id).status for m in cancelled} == {"cancelled"}


def test_merge_order_key_orders_ties_by_id():
    entries = [(b"2", "msg_b"), (b"1", "msg_z"), (b"2", "msg_a")]
    assert sorted(entries, key=merged_pages.order_key) == [(b"1", "msg_z"), (b"2", "msg_a"), (b"2", "msg_b")]


def test_the_list_pages_by_cursor(spread, superuser_client):
    send_spread(120, status="failed")
    want = expected(spread, "failed")
    url = u("message_list") + "?status=failed"
    response = superuser_client.get(url)
    html = text_of(response)
    assert response.status_code == 200 and listed_ids(html) == want[:50]
    assert response.context["next_url"] and not response.context["previous_url"]
    seen = listed_ids(html)
    while response.context["next_url"]:
        response = superuser_client.get(u("message_list") + response.context["next_url"])
        assert response.status_code == 200
        seen += listed_ids(text_of(response))
    assert seen == want
    back = superuser_client.get(u("message_list") + response.context["previous_url"])
    assert listed_ids(text_of(back)) == want[50:100]
    assert 'data-total="120"' in text_of(back)


@pytest.mark.parametrize("token", ["x", "a" * 400, "eyJ9", "%00", "1:2:3"])
def test_a_bad_page_token_is_a_400_with_the_first_page(spread, superuser_client, token):
    send_spread(20)
    response = superuser_client.get(u("message_list"), {"c": token})
    assert response.status_code == 400
    assert listed_ids(text_of(response)) == expected(spread, None)[:20]


def test_one_call_across_partitions_is_what_a_cluster_refuses(spread):
    """Why the partitions are read one call each: the old single merged call over every
    partition's sorted sets is refused by the cluster (CROSSSLOT); a single server takes it."""
    send_spread(40)
    index = spread.index(None)
    if isinstance(spread.connection, RedisCluster):
        with pytest.raises(Exception, match="(?i)slot"):
            spread.merged_range(index, IndexRange(descending=True), offset=0, count=5)
    else:
        assert len(spread.merged_range(index, IndexRange(descending=True), offset=0, count=5)[0]) == 5


def test_created_range_with_a_status_is_checked_across_partitions(spread):
    sent = send_spread(40, status="succeeded")
    created = sorted(outbox.records.created_at_of(m.id) for m in sent)
    flt = MessageFilter(status="succeeded", created=TimeRange(created[10], created[29]))
    ids = [i for p in walk(spread, flt, 6)[0] for i in p.ids]
    want = [
        i
        for i in expected(spread, "succeeded")
        if created[10] <= outbox.records.created_at_of(i) <= created[29]
    ]
    assert ids == want and len(ids) >= 20


@pytest.mark.parametrize("p", ["2", "10000000000000000000", "1" * 400])
def test_a_page_number_is_ignored_with_a_note(spread, superuser_client, p):
    """Numbered pages would read P x N pages: with partitions ``?p=`` shows the first page."""
    send_spread(60)
    response = superuser_client.get(u("message_list"), {"p": p})
    html = text_of(response)
    assert response.status_code == 200
    assert "the list pages by Previous and Next, not by number; this is the first page." in html
    assert listed_ids(html) == expected(spread, None)[:50]
    assert response.context["next_url"] and "p=" not in response.context["next_url"]


def test_a_budget_under_the_partitions_still_counts_every_partition(spread):
    send_spread(40, status="failed")
    page = queries.page_at(spread, MessageFilter(status="failed", queue="outbox"), limit=10, scan_limit=5)
    assert (page.index_total, page.scanned, page.exact) == (40, 5, False)


def test_the_requeue_command_by_filter_acts_in_every_partition(spread):
    import io

    from django.core.management import call_command

    sent = send_spread(64, status="failed")
    out = io.StringIO()
    call_command("outbox_requeue", "--destination", "hook", "--dry-run", stdout=out, stderr=io.StringIO())
    assert "32 message(s) match: status failed, destination hook." in out.getvalue()
    call_command("outbox_requeue", "--destination", "hook", "--yes", stdout=out, stderr=io.StringIO())
    assert "32 requeued." in out.getvalue()
    hook = [m.id for m in sent if m.destination == "hook"]
    assert len({partition_of(i) for i in hook}) > 8
    assert {outbox.get(i).status for i in hook} == {"pending"}
    assert spread.count("failed") == 32


def test_filter_by_rank_reads_one_partition_per_call(spread):
    """``repo.filter`` (pages by rank) merges the partitions' calls, as one index would be read."""
    send_spread(50)
    want = expected(spread, None)
    assert spread.filter(offset=0, limit=7) == want[:7]
    assert spread.filter(offset=20, limit=30) == want[20:50]
    assert spread.filter(offset=45, limit=10, newest_first=False) == want[::-1][45:]


@pytest.mark.parametrize("seed", range(4))
def test_a_small_budget_reaches_the_one_partition_that_holds_messages(spread, seed):
    """Keyless messages of one send_many share a partition: a scan whose budget is under
    the number of partitions still spends it there (the others count 0 in its first round)."""
    sent = outbox.send_many([{"destination": "mem", "body": {"n": i}} for i in range(12)])
    now = time.time()
    spread.transition(
        [
            Change(id=m.id, from_statuses=("pending",), to="failed", score=now - i * 1e-3)
            for i, m in enumerate(sent)
        ],
        now,
    )
    page = queries.page_at(spread, MessageFilter(status="failed", queue="outbox"), limit=50, scan_limit=5)
    assert (len(page.ids), page.scanned, page.exact) == (5, 5, False)
    offset_page = queries.page(spread, MessageFilter(status="failed", queue="outbox"), limit=50, scan_limit=5)
    assert (len(offset_page.ids), offset_page.scanned) == (5, 5)
