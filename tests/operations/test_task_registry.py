"""The status page of background actions reads only the outbox's registry of the jobs
the console started (JSON, ``<prefix>:task:<job id>``), never RQ's pickled job data
(issue 20, item 10): a job hash planted in Redis must not run code in the web process."""

from __future__ import annotations

import os
import pickle

import pytest
from django.contrib import admin
from rq.job import Job

from outbox.models import Message as MessageModel
from tests.support.console import element_text, make, text_of, u

pytestmark = pytest.mark.django_db(transaction=True)


class Planted:
    """Unpickling this creates the directory ``path`` (stands for any code run)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def plant(redis, job_id: str, marker) -> None:
    """Write an RQ job hash whose pickled fields run code when unpickled."""
    poison = pickle.dumps(Planted(str(marker)))
    redis.hset(
        Job.key_for(job_id),
        mapping={
            "meta": poison,
            "data": poison,
            "status": "finished",
            "created_at": "2026-01-01T00:00:00.000000Z",
            "description": "outbox requeue",
        },
    )


def start_background(superuser_client, repo, monkeypatch, n: int = 12) -> str:
    """Start a background requeue through the console; returns the status page's URL."""
    monkeypatch.setattr(admin.site._registry[MessageModel], "sync_action_limit", 5)
    make(repo, n, "failed")
    data = {"action": "requeue", "select_across": "1", "status": "failed", "post": "yes"}
    response = superuser_client.post(u("message_action"), data)
    assert response.status_code == 302
    return response["Location"]


def test_a_planted_job_outside_the_registry_is_404_and_never_unpickled(viewer_client, repo, redis, tmp_path):
    marker = tmp_path / "ran"
    plant(redis, "planted1", marker)
    response = viewer_client.get(u("message_action_status", "planted1"))
    assert response.status_code == 404
    assert not marker.exists()


def test_a_planted_job_hash_under_a_registered_id_is_never_unpickled(
    superuser_client, repo, redis, tmp_path, monkeypatch
):
    status_url = start_background(superuser_client, repo, monkeypatch)
    job_id = status_url.rstrip("/").rsplit("/", 1)[-1]
    marker = tmp_path / "ran"
    plant(redis, job_id, marker)  # overwrites the fields of the real job
    response = superuser_client.get(status_url)
    assert response.status_code == 200
    assert not marker.exists()
    html = text_of(response)
    assert element_text(html, "task-state") == "queued"  # the registry's word, not the hash's
    assert element_text(html, "task-acted") == "0"


def test_the_registry_holds_the_job_with_a_ttl_and_the_job_writes_its_counts_there(
    superuser_client, repo, redis, rq_redis, worker, monkeypatch
):
    status_url = start_background(superuser_client, repo, monkeypatch, n=1100)
    job_id = status_url.rstrip("/").rsplit("/", 1)[-1]
    keys = list(redis.scan_iter(match=repo.keys.task("*")))
    assert keys == [repo.keys.task(job_id).encode()]
    assert 0 < redis.ttl(keys[0]) <= 7 * 24 * 3600
    worker(simple=True)
    html = text_of(superuser_client.get(status_url))
    assert element_text(html, "task-state") == "finished"
    assert element_text(html, "task-acted") == "1,100"
    assert "1,100 requeued" in element_text(html, "task-report")
    # a job RQ no longer has (expired, or never kept) changes nothing: the registry answers
    rq_redis.delete(Job.key_for(job_id))
    assert element_text(text_of(superuser_client.get(status_url)), "task-state") == "finished"


def test_a_job_rq_lost_before_it_reported_shows_as_lost(superuser_client, repo, rq_redis, monkeypatch):
    status_url = start_background(superuser_client, repo, monkeypatch)
    job_id = status_url.rstrip("/").rsplit("/", 1)[-1]
    rq_redis.delete(Job.key_for(job_id))  # e.g. `rq empty`, or a flushed RQ database
    html = text_of(superuser_client.get(status_url))
    assert element_text(html, "task-state") == "lost"
    assert "no longer in RQ" in element_text(html, "task-error")
    assert 'http-equiv="refresh"' not in html


def test_a_job_rq_ended_without_a_report_shows_rq_s_state(superuser_client, repo, rq_redis, monkeypatch):
    status_url = start_background(superuser_client, repo, monkeypatch)
    job_id = status_url.rstrip("/").rsplit("/", 1)[-1]
    rq_redis.hset(Job.key_for(job_id), "status", "stopped")  # as RQ does when it kills the work horse
    html = text_of(superuser_client.get(status_url))
    assert element_text(html, "task-state") == "stopped"
    assert "failed job registry" in element_text(html, "task-error")


def test_a_job_that_raises_reports_failed_with_its_error(superuser_client, repo, redis, worker, superuser):
    from outbox.admin_views import tasks
    from outbox.operations.operation import REQUEUE, Selection

    # ids that are not str make the operation raise TypeError inside the job
    job_id = tasks.start(REQUEUE, Selection(ids=[1, 2], description="bad ids"), superuser.pk, 2)
    worker(simple=True)
    html = text_of(superuser_client.get(u("message_action_status", job_id)))
    assert element_text(html, "task-state") == "failed"
    assert "TypeError: message ids must be str" in element_text(html, "task-error")
    assert 'http-equiv="refresh"' not in html
