"""The console's building blocks: read-only queries (real Redis), filters, chart, formatting."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest
from django.test import override_settings

import outbox
from outbox.admin_views.chart import outcome_chart
from outbox.admin_views.filters import parse_list_query, parse_time
from outbox.admin_views.formatting import duration, mask_headers, preview_body, safe_content_type, shorten
from outbox.operations.operation import REQUEUE, Selection
from outbox.store.reads import queries
from outbox.store.reads.queries import MessageFilter, TimeRange
from outbox.store.repository import Index
from tests.support.console import make

pytestmark = pytest.mark.django_db(transaction=True)  # send() writes at once (no atomic block)


# -- queries -------------------------------------------------------------------------
def test_created_at_of_reads_the_id():
    m = outbox.records.new_message_id(1763780000.1234)
    assert outbox.records.created_at_of(m) == 1763780000.123
    assert outbox.records.created_at_of("custom-id") == 0.0


@pytest.mark.parametrize(
    "status, field, served_range",
    [
        (None, "created", "created"),
        ("pending", "next_attempt", None),
        ("retrying", "next_attempt", None),
        ("sending", "lease", None),
        ("succeeded", "updated", "updated"),
        ("failed", "updated", "updated"),
        ("cancelled", "updated", "updated"),
    ],
)
def test_plan_serves_what_the_index_scores(repo, status, field, served_range):
    flt = MessageFilter(status=status, created=TimeRange(1, 2), updated=TimeRange(3, 4), queue="q")
    p = queries.plan(repo, flt)
    assert p.score_field == field
    assert p.index == repo.index(status)
    assert (p.lo, p.hi) == {"created": (1, 2), "updated": (3, 4), None: (None, None)}[served_range]
    assert bool(p.check_created) == (served_range != "created")
    assert bool(p.check_updated) == (served_range != "updated")
    assert p.check_queue == "q" and not p.exact


def test_an_index_across_destinations_reads_as_one_sorted_set(repo):
    """Pages, counts and checked scans of several sorted sets (one per destination) merged
    in Redis give exactly what one sorted set holding them all would: score order, ties
    by id, both directions, any offset, score bounds inclusive or exclusive."""
    import random

    rng = random.Random(7)
    # one hash tag: sorted sets of one slot, as a partition's are (and a cluster requires)
    keys = [f"outbox:{{t}}:test:merge:{d}" for d in "abcd"]
    union = "outbox:{t}:test:merge:all"
    for n, key in enumerate(keys):
        members = {
            f"m{n}{i:03d}": float(rng.choice([1, 2, 2, 3, 5, 8, 8, 8, 13]) + rng.random() * (i % 3 == 0))
            for i in range(40 + 25 * n)
        }
        repo.connection.zadd(key, members)
        repo.connection.zadd(union, members)
    index = Index(tuple(keys))
    for lo, hi in [(None, None), (2, 8), (2.5, None), (None, 1)]:
        p = queries.Plan(filter=MessageFilter(), index=index, score_field="created", lo=lo, hi=hi)
        one = queries.Plan(filter=MessageFilter(), index=Index((union,)), score_field="created", lo=lo, hi=hi)
        assert queries.count_range(repo, p) == queries.count_range(repo, one)
        for descending in (False, True):
            for offset, limit in [(0, 10), (7, 30), (95, 50), (0, 500), (400, 5)]:
                merged = queries.range_ids(repo, p, offset=offset, limit=limit, descending=descending)
                assert merged == queries.range_ids(
                    repo, one, offset=offset, limit=limit, descending=descending
                )
                assert queries.scan(repo, p, offset=offset, count=limit, descending=descending)[0] == merged
            # a walk in chunks, each going on right after the last one's end, reads it all once
            walked, after = [], None
            while True:
                found, examined, after = queries.scan(
                    repo, p, offset=0, count=7, descending=descending, after=after
                )
                walked += found
                if examined < 7:
                    break
            assert walked == queries.range_ids(repo, one, offset=0, limit=10_000, descending=descending)
    assert (
        queries.range_ids(
            repo, queries.Plan(MessageFilter(), Index(()), "created"), offset=0, limit=5, descending=True
        )
        == []
    )


def test_range_ids_reads_by_rank_within_bounds(repo):
    key = "outbox:test:index"
    repo.connection.zadd(key, {f"m{i:03d}": i for i in range(100)})
    p = queries.Plan(filter=MessageFilter(), index=Index((key,)), score_field="created", lo=10, hi=59)
    assert queries.count_range(repo, p) == 50
    assert queries.range_ids(repo, p, offset=0, limit=3, descending=False) == ["m010", "m011", "m012"]
    assert queries.range_ids(repo, p, offset=0, limit=3, descending=True) == ["m059", "m058", "m057"]
    assert queries.range_ids(repo, p, offset=48, limit=5, descending=False) == ["m058", "m059"]
    assert queries.range_ids(repo, p, offset=48, limit=5, descending=True) == ["m011", "m010"]
    assert queries.range_ids(repo, p, offset=50, limit=5, descending=True) == []
    unbounded = queries.Plan(filter=MessageFilter(), index=Index((key,)), score_field="created")
    assert queries.range_ids(repo, unbounded, offset=98, limit=5, descending=False) == ["m098", "m099"]
    assert queries.range_ids(repo, unbounded, offset=0, limit=2, descending=True) == ["m099", "m098"]


def test_page_counts_exactly_with_served_filters(repo):
    make(repo, 4, "failed", destination="hook")
    time.sleep(0.01)
    cut = time.time()
    late = make(repo, 3, "failed", destination="hook")
    make(repo, 5, "failed", destination="mem")
    result = queries.page(
        repo, MessageFilter(status="failed", destination="hook", updated=TimeRange(cut, None))
    )
    assert result.exact and result.scanned == 0
    assert result.total == 3
    assert set(result.ids) == {m.id for m in late}


def test_page_bounded_scan_is_a_lower_bound(repo):
    make(repo, 30, "failed")
    result = queries.page(repo, MessageFilter(status="failed", queue="outbox"), limit=10, scan_limit=12)
    assert not result.exact
    assert (result.scanned, result.index_total, result.total) == (12, 30, 12)
    assert len(result.ids) == 10
    assert result.plan.limits == ["queue"]
    full = queries.page(repo, MessageFilter(status="failed", queue="outbox"), scan_limit=100)
    assert full.exact and full.total == 30


def test_iter_matching_stops_at_as_of(repo):
    first = make(repo, 5, "failed")
    as_of = time.time()
    time.sleep(0.01)
    make(repo, 3, "failed")
    got = [
        i
        for batch in queries.iter_matching(repo, MessageFilter(), ["failed"], as_of=as_of, batch=2)
        for i in batch
    ]
    assert sorted(got) == sorted(m.id for m in first)


def test_iter_matching_survives_the_action_moving_ids(repo):
    failed = make(repo, 25, "failed")
    batches = queries.iter_matching(repo, MessageFilter(), ["failed"], as_of=time.time(), batch=4)
    seen = []
    for batch in batches:
        seen += batch
        outbox.requeue(batch)  # the walked index shrinks under the iterator
    assert sorted(seen) == sorted(m.id for m in failed)


def test_count_matching_sums_statuses(repo):
    make(repo, 2, "failed")
    make(repo, 3, "cancelled")
    make(repo, 4)
    count = queries.count_matching(repo, MessageFilter(), REQUEUE.statuses)
    assert (count.n, count.exact) == (5, True)
    assert queries.eligible_statuses(MessageFilter(status="pending"), REQUEUE.statuses) == []


def test_find_by_id_and_key(repo):
    keyed = outbox.send("mem", "x", idempotency_key="the-key")
    assert queries.find(repo, keyed.id) == [keyed.id]
    assert queries.find(repo, " the-key ") == [keyed.id]
    assert queries.find(repo, "nope") == [] and queries.find(repo, "") == []


def test_summaries_leave_the_body_out(repo):
    m = outbox.send("mem", "a body", headers={"X-A": "1"}, idempotency_key="k")
    got = queries.summaries(repo, [m.id, "msg_missing"])
    assert got[1] is None
    assert got[0].body == b"" and got[0].headers == {"X-A": "1"} and got[0].idempotency_key == "k"
    assert got[0].status == "pending" and got[0].destination == "mem"


def test_counts_by_destination(repo):
    make(repo, 2, "failed", destination="hook")
    make(repo, 1, destination="mem")
    counts = repo.counts_by_destination(repo.destinations())
    assert counts["hook"]["failed"] == 2 and counts["mem"]["pending"] == 1 and counts["mem"]["failed"] == 0


def test_selection_round_trips_for_background_jobs():
    s = Selection(
        filter=MessageFilter("failed", "hook", "outbox", TimeRange(1.0, None), TimeRange(None, 2.0)),
        as_of=3.0,
    )
    assert Selection.from_dict(s.to_dict()) == s


# -- filters -------------------------------------------------------------------------
@override_settings(TIME_ZONE="Europe/Paris")
def test_parse_time_formats():
    now = 1_000_000.0
    assert parse_time("2h", now) == now - 7200
    assert parse_time("7d", now) == now - 7 * 86400
    assert parse_time("1763780000.5") == 1763780000.5
    assert parse_time("2025-01-01T00:00Z") == datetime(2025, 1, 1, tzinfo=timezone.utc).timestamp()
    assert (
        parse_time("2025-01-01T01:00") == datetime(2025, 1, 1, tzinfo=timezone.utc).timestamp()
    )  # Paris, UTC+1
    assert parse_time("2025-01-01") == datetime(2024, 12, 31, 23, tzinfo=timezone.utc).timestamp()
    with pytest.raises(ValueError):
        parse_time("tomorrow")


def test_parse_list_query_and_links():
    q = parse_list_query({"status": "failed", "destination": "hook", "o": "-updated", "p": "3", "junk": "1"})
    assert q.filter.status == "failed" and q.filter.destination == "hook"
    assert (q.sort, q.descending, q.page) == ("updated", True, 3)
    assert q.querystring(p=4) == "?status=failed&destination=hook&o=-updated&p=4"
    assert (
        q.querystring(status="retrying") == "?status=retrying&destination=hook&o=-updated"
    )  # back to page 1
    assert q.filter_params == {"status": "failed", "destination": "hook"}
    bad = parse_list_query({"status": "weird", "o": "body", "p": "x", "updated_to": "never"})
    assert bad.filter.status is None and not bad.sort and bad.page == 1
    assert len(bad.errors) == 4


# -- chart and formatting ------------------------------------------------------------
def test_outcome_chart_stacks_and_scales():
    chart = outcome_chart([10, 11, 12], {"succeeded": [2, 0, 6], "failed": [2, 0, 0]}, width=300, height=120)
    assert chart.peak == 6 and chart.totals == {"succeeded": 8, "failed": 2}
    plot_h = 120 - chart.top - chart.bottom
    first, empty, last = chart.bars
    assert [s.series for s in first.segments] == ["succeeded", "failed"]
    assert first.segments[0].h == pytest.approx(plot_h * 2 / 6, abs=0.02)
    assert first.segments[1].y + first.segments[1].h == pytest.approx(first.segments[0].y, abs=0.02)
    assert empty.segments == []
    assert last.segments[0].h == pytest.approx(plot_h, abs=0.02)
    assert last.minute == datetime.fromtimestamp(12 * 60, tz=timezone.utc)
    assert outcome_chart([5], {"succeeded": [0], "failed": [0]}).peak == 1


def test_mask_headers():
    shown = dict(
        (n, v)
        for n, v, _ in mask_headers(
            {
                "Authorization": "Bearer abc",
                "X-Api-Key": "k",
                "api_key": "k",
                "X-Auth-Token": "t",
                "Cookie": "c",
                "X-Client-Secret": "s",
                "Webhook-Signature": "sig",
                "X-Trace": "visible",
            }
        )
    )
    assert shown["X-Trace"] == "visible"
    assert all(v.startswith("••••") for n, v in shown.items() if n != "X-Trace")
    assert "abc" not in shown["Authorization"]


def test_preview_body():
    assert preview_body(b'{"a":1}', "application/json").text == '{\n  "a": 1\n}'
    assert preview_body(b"[1]", "text/plain").is_json
    not_json = preview_body(b"{oops", "application/json")
    assert not not_json.is_json and not_json.text == "{oops"
    big = preview_body("é".encode() * 10, "text/plain", limit=5)
    assert big.truncated and big.text == "éé" and not big.binary
    raw = preview_body(b"\xff\xfe", "application/octet-stream")
    assert raw.binary and raw.text == "\ufffd\ufffd"


def test_small_formatters():
    assert duration(5) == "5s" and duration(192) == "3m 12s" and duration(7500) == "2h 5m"
    assert duration(3 * 86400 + 4 * 3600) == "3d 4h"
    assert shorten("a\n b  c", 10) == "a b c" and shorten("x" * 20, 5) == "xxxx…"
    assert safe_content_type("text/html; charset=utf-8") == "text/html; charset=utf-8"
    assert safe_content_type("bad\r\nX: y") == "application/octet-stream"
    assert safe_content_type("") == "application/octet-stream"


@override_settings(TIME_ZONE="Europe/Paris")
def test_template_filters_group_numbers_and_show_time_zones():
    from outbox.templatetags.outbox_admin import grouped, id_parts, when

    assert grouped(1234567) == "1,234,567" and grouped("59956") == "59,956" and grouped(12) == "12"
    assert grouped(None) is None  # not a number: unchanged
    winter = datetime(2001, 1, 2, 9, 5, 7, 123456, tzinfo=timezone.utc)
    assert when(winter) == '<time datetime="2001-01-02T10:05:07.123456+01:00">2001-01-02 10:05:07 CET</time>'
    assert "2001-01-02 10:05:07.123 CET</time>" in when(winter, "precise")
    short = when(winter, "short")
    assert (
        'title="2001-01-02 10:05:07 CET"' in short and ">2001-01-02</time>" in short
    )  # another year: the date
    assert when(None) == "–" and "CET" in when("2001-01-02T09:05:07.123456Z")  # RQ's heartbeat format
    assert id_parts("msg_01a2017c4826cc7d4f60b1632852") == ("msg_", "01a2017c4826cc7d4f60", "b1632852")
    # an id naming its partition keeps 8 random digits in its end, and the partition
    assert id_parts("msg_01a2017c4826cc7d4f60b1632852_p12") == (
        "msg_",
        "01a2017c4826cc7d4f60",
        "b1632852_p12",
    )
