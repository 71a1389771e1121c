"""The console and the bulk commands answer bad input and an unreachable Redis with a
message, never a 500 or a traceback (issue 6, items 5, 9, 10), including for
arbitrary query parameters (hypothesis)."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

import outbox
from outbox.admin_views.filters import FILTER_PARAMS, LIST_PARAMS, parse_as_of, parse_time
from tests.support import redis_down
from tests.support.console import make, u

pytestmark = pytest.mark.django_db(transaction=True)

PROPERTY = hypothesis_settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def post_action(client, data: dict):
    return client.post(u("message_action"), data)


# -- item 5: 404 / 400 instead of 500 --------------------------------------------------------------


@pytest.mark.parametrize("job_id", ["a.b", "a b", "a%2Fb", "ü", "x" * 200])
def test_an_action_status_id_outside_the_job_id_alphabet_is_404(superuser_client, repo, job_id):
    response = superuser_client.get(f"/admin/outbox/message/action/{job_id}/")
    assert response.status_code == 404


def test_a_history_link_to_an_id_with_a_slash_is_404(superuser_client, repo):
    assert superuser_client.get("/admin/outbox/message/messages/_2F/change/").status_code == 404
    (m,) = make(repo, 1)
    assert superuser_client.get(f"/admin/outbox/message/messages/{m.id}/change/").status_code == 302


@pytest.mark.parametrize(
    "query",
    [
        "created_from=nan",
        "status=failed&updated_from=nan",
        "created_to=inf",
        "created_from=-inf",
        "updated_to=1e400",
    ],
)
def test_non_finite_time_filters_are_400_with_a_message(superuser_client, repo, query):
    make(repo, 2, "failed")
    response = superuser_client.get(u("message_list") + "?" + query)
    assert response.status_code == 400
    assert "not a time" in response.content.decode()


@pytest.mark.parametrize("confirm", [False, True])
def test_select_all_with_a_non_finite_filter_or_as_of_is_400(superuser_client, repo, confirm):
    make(repo, 2, "failed")
    data = {"action": "delete", "select_across": "1", "status": "failed", "updated_from": "nan"}
    if confirm:
        data["post"] = "yes"
    response = post_action(superuser_client, data)
    assert response.status_code == 400 and "nothing was changed" in response.content.decode()
    data = {"action": "delete", "select_across": "1", "status": "failed", "as_of": "nan", "post": "yes"}
    response = post_action(superuser_client, data)
    assert response.status_code == 400 and "as_of" in response.content.decode()
    assert repo.count("failed") == 2


def test_parse_time_and_as_of_refuse_non_finite_values():
    for bad in ("nan", "inf", "-inf", "1e400", "NaN", "99999999999999w"):
        with pytest.raises(ValueError):
            parse_time(bad)
    with pytest.raises(ValueError):
        parse_as_of("nan", 100.0)
    assert (
        parse_as_of("50", 100.0) == 50.0
        and parse_as_of("500", 100.0) == 100.0
        and parse_as_of(None, 7.0) == 7.0
    )


# -- item 10: search keeps what was typed ----------------------------------------------------------


def test_an_idempotency_key_with_surrounding_spaces_can_be_found(superuser_client, repo):
    m = outbox.send("mem", {"a": 1}, idempotency_key="  spaced key ")
    other = outbox.send("mem", {"a": 2}, idempotency_key="spaced key")
    html = superuser_client.get(u("message_list"), {"q": "  spaced key "}).content.decode()
    assert m.id in html
    html = superuser_client.get(u("message_list"), {"q": "spaced key"}).content.decode()
    assert other.id in html and m.id not in html


# -- item 9: Redis down ------------------------------------------------------------------------------


@pytest.mark.parametrize("page", ["dashboard", "message_list", "detail", "body", "status"])
def test_console_pages_answer_503_with_what_to_check_when_redis_is_down(
    superuser_client, repo, page, settings
):
    (m,) = make(repo, 1)
    paths = {
        "dashboard": u("dashboard"),
        "message_list": u("message_list") + "?status=failed",
        "detail": u("message_detail", m.id),
        "body": u("message_body", m.id),
        "status": u("message_action_status", "abc"),
    }
    with redis_down():
        response = superuser_client.get(paths[page])
    assert response.status_code == 503
    html = response.content.decode()
    # where to look: the cache alias, or in cluster mode the cluster setting
    where = "OUTBOX[&#x27;CLUSTER&#x27;]" if settings.OUTBOX.get("CLUSTER") else "CACHES[&#x27;default&#x27;]"
    assert "Redis is unavailable" in html and where in html and "running" in html


def test_a_bulk_action_answers_503_when_redis_is_down(superuser_client, repo):
    with redis_down():
        response = post_action(
            superuser_client, {"action": "requeue", "select_across": "1", "status": "failed"}
        )
    assert response.status_code == 503


@pytest.mark.parametrize("command", ["outbox_requeue", "outbox_purge"])
def test_bulk_commands_say_redis_is_down_in_one_line(repo, command):
    with redis_down(), pytest.raises(CommandError) as info:
        call_command(command, "--yes")
    text = str(info.value)
    assert "cannot reach Redis" in text and "nothing changed" in text and "\n" not in text


def test_requeue_refuses_an_unknown_destination_as_send_does(repo):
    with pytest.raises(CommandError, match="unknown destination 'nosuch'"):
        call_command("outbox_requeue", "--destination", "nosuch", "--yes")


def test_purge_accepts_a_destination_removed_from_the_settings(repo):
    make(repo, 2, "failed")
    with override_settings(
        OUTBOX={**settings.OUTBOX, "DESTINATIONS": {"hook": settings.OUTBOX["DESTINATIONS"]["hook"]}}
    ):
        call_command("outbox_purge", "--destination", "mem", "--yes")
        with pytest.raises(CommandError, match="unknown destination 'nosuch'"):
            call_command("outbox_purge", "--destination", "nosuch", "--yes")
    assert repo.count("failed") == 0


# -- properties: no query string makes a 500 -----------------------------------------------------

param_values = st.one_of(
    st.text(max_size=12),
    st.sampled_from(
        ["nan", "inf", "-1e400", "1e308", "7d", "2025-11-21", "9999-12-31T23:59", "0001-01-01", "-5"]
    ),
    st.sampled_from(["failed", "pending", "created", "-updated", "next_attempt", "999999999999"]),
)


@PROPERTY
@given(params=st.dictionaries(st.sampled_from(LIST_PARAMS), param_values, max_size=5))
def test_the_message_list_never_answers_500(superuser_client, repo, params):
    response = superuser_client.get(u("message_list"), params)
    assert response.status_code in (200, 400)


@PROPERTY
@given(
    params=st.dictionaries(st.sampled_from([*FILTER_PARAMS, "q", "as_of"]), param_values, max_size=4),
    action=st.sampled_from(["requeue", "cancel", "delete", "bogus"]),
    confirm=st.booleans(),
)
def test_bulk_actions_never_answer_500(superuser_client, repo, params, action, confirm):
    data = {"action": action, "select_across": "1", **params, **({"post": "yes"} if confirm else {})}
    response = post_action(superuser_client, data)
    assert response.status_code in (200, 302, 400)
