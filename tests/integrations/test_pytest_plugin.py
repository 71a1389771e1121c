"""The pytest plugin (``pytest11`` entry point ``outbox``) in a new project's test run:
``outbox_redis`` starts a private server, ``outbox_sent`` sees what a test sent,
``outbox_deliver`` delivers it in process; in async tests (pytest-asyncio) too:
``aoutbox_deliver``, ``outbox_sent``'s awaitable twins, eager mode under ``asend``."""

from __future__ import annotations

import textwrap

SETTINGS = """
SECRET_KEY = "plugin-test"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_rq", "outbox"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
# a Redis nobody runs: the plugin's outbox_redis points the alias at its private server
CACHES = {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "redis://127.0.0.1:1/0"}}
RQ_QUEUES = {"outbox": {"USE_REDIS_CACHE": "default"}, "outbox_high": {"HOST": "elsewhere", "PORT": 1},
             "outbox_low": {"USE_REDIS_CACHE": "default"}}
OUTBOX = {"DESTINATIONS": {"audit": {"TRANSPORT": "callable", "OPTIONS": {"path": "project_hooks.record"}}}}
"""

HOOKS = """
received = []

def record(message):
    received.append(message.json())
"""

TESTS = """
import pytest

import outbox
import project_hooks


def test_sent_and_delivered(outbox_sent, outbox_deliver):
    outbox_sent.assert_nothing_sent()
    outbox.send("audit", {"event": "signup"})
    outbox_sent.assert_sent("audit", count=1, body={"event": "signup"})
    report = outbox_deliver()
    assert report.succeeded == 1
    assert project_hooks.received == [{"event": "signup"}]
    assert outbox.get(outbox_sent[0].id).status == "succeeded"


def test_each_test_starts_empty(outbox_sent, outbox_redis):
    assert outbox_redis.dbsize() == 0
    outbox_sent.assert_nothing_sent()


@pytest.mark.asyncio
async def test_async_sent_and_delivered(outbox_sent, aoutbox_deliver):
    await outbox_sent.aassert_nothing_sent()
    message = await outbox.asend("audit", {"event": "async"})
    await outbox_sent.aassert_sent("audit", count=1, body={"event": "async"})
    assert [m.id for m in await outbox_sent.amessages()] == [message.id]
    report = await aoutbox_deliver()
    assert report.succeeded == 1 and {"event": "async"} in project_hooks.received
    assert (await outbox.aget(message.id)).status == "succeeded"


@pytest.mark.asyncio
async def test_eager_mode_under_asend(outbox_sent, settings):
    settings.OUTBOX = {**settings.OUTBOX, "EAGER": True}
    message = await outbox.asend("audit", {"event": "eager"})
    assert message.status == "succeeded" and {"event": "eager"} in project_hooks.received
"""


def test_plugin_fixtures_in_a_new_project(pytester):
    pytester.makepyfile(project_settings=SETTINGS, project_hooks=HOOKS, test_project=TESTS)
    pytester.makeini(
        textwrap.dedent(
            """
            [pytest]
            pythonpath = .
            """
        )
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--ds=project_settings")
    result.assert_outcomes(passed=4)


def test_a_project_in_cluster_mode_is_tested_on_the_private_server(pytester):
    """outbox_redis drops OUTBOX["CLUSTER"] for the test: the data never goes to (nor is
    flushed on) the cluster of the project's settings, here one nobody runs."""
    cluster = '\nOUTBOX["CLUSTER"] = {"NODES": ["redis://127.0.0.1:1"]}\n'
    pytester.makepyfile(project_settings=SETTINGS + cluster, project_hooks=HOOKS, test_project=TESTS)
    pytester.makeini("[pytest]\npythonpath = .\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--ds=project_settings")
    result.assert_outcomes(passed=4)


DOC_PROJECT_SETTINGS = (
    SETTINGS.replace('"audit": {"TRANSPORT": "callable"', '"crm": {"TRANSPORT": "callable"')
    + 'ROOT_URLCONF = "project_urls"\nMIDDLEWARE = []\n'
)

DOC_PROJECT_URLS = """
from django.contrib.auth.models import User
from django.http import HttpResponse
from django.urls import path

import outbox


def signup(request):
    User.objects.create(username=request.POST["email"])
    outbox.send("crm", {"email": request.POST["email"]})
    return HttpResponse("welcome")


urlpatterns = [path("signup/", signup)]
"""


def test_the_first_example_of_docs_testing_md_passes_as_written(pytester):
    """docs/testing.md's first example, copied as it stands, in a project whose signup
    view writes a user and sends to 'crm' (issue 20, item 14: it lacked django_db)."""
    from tests.support import ROOT

    doc = (ROOT / "docs" / "testing.md").read_text()
    blocks = doc.split("```python\n")[1:]
    (example,) = [b.split("```", 1)[0] for b in blocks if "def test_signup_notifies_the_crm" in b]
    pytester.makepyfile(
        project_settings=DOC_PROJECT_SETTINGS,
        project_hooks=HOOKS,
        project_urls=DOC_PROJECT_URLS,
        test_doc_example=example,
    )
    pytester.makeini("[pytest]\npythonpath = .\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--ds=project_settings")
    result.assert_outcomes(passed=1)
