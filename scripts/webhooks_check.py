"""The webhooks check (issue 34's "Done when", from outside): a new Django project made
only from docs/webhooks.md ("Webhooks for your customers"), run from the installed wheel.

    scripts/webhooks-check            # builds the wheel and a virtualenv of its own
    scripts/package-check             # runs it too, in the virtualenv it made (CI's step 1)

Steps (each prints one line; any failure exits 1 with the reason):

1. ``django-admin startproject``, then the python block of the guide's "Set-up" section
   appended to the project's settings as written, then the local substitutions
   (``SETTINGS_TAIL``): the private Redis's URL, the startproject apps for the guide's
   ``...``, a local-memory cache for its ``"default": {...}``, the guide's "Trying it on
   your machine" (``ALLOW_PRIVATE_NETWORKS``: the receivers are on 127.0.0.1) and the
   database; ``OUTBOX_ENDPOINT_KEY`` is a new Fernet key, as the guide says;
2. the database: a new PostgreSQL database ``outbox_webhooks_check_<random>`` on the
   server of ``OUTBOX_TEST_POSTGRES`` (as tests/settings.py: default 127.0.0.1:5432, trust
   auth, connecting to the ``test`` database; dropped at the end); SQLite, with the reason
   printed, when no PostgreSQL answers;
3. ``migrate``, ``check --database default`` (no errors);
4. the registry: 4 event types (3 through ``outbox.webhooks``, 1 through the admin), 3
   applications (2 through the API, 1 through the admin), 5 endpoints each with different
   type filters and channels (3 through the API, 2 through the admin's add form, whose
   page shows the secret once: read from there). The admin is driven by Django's test
   client as a logged-in superuser (every form goes through the admin's views);
5. ``EVENTS`` events of the 4 types published to random applications with random channels
   (some batches inside ``transaction.atomic``), then ``manage.py outbox_worker --burst``;
6. one HTTP server on loopback, a path per endpoint, verifies every request with that
   endpoint's own secret (``standardwebhooks``); each endpoint must have received exactly
   the events it subscribed to (by ``webhook-id``, computed from the guide's fan-out
   rules, not by the outbox), none twice, none refused;
7. rotation: one endpoint's secret rotated through the API with an hour's overlap, one
   through the admin's action (the default overlap, the new secret read from the page),
   one through the API with none; 30 events published then must verify with the old and
   with the new secret (two signatures) during an overlap, with the new one only (and
   not with the old) without one;
8. a summary table, one row per endpoint.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: How many events the check publishes (of 4 types, to 3 applications).
EVENTS = 1000


def step(text: str) -> None:
    print(f"webhooks-check: {text}", flush=True)


def fail(text: str) -> None:
    print(f"webhooks-check: FAILED: {text}", file=sys.stderr, flush=True)
    sys.exit(1)


def guide_settings() -> str:
    """The python block of docs/webhooks.md's "Set-up" section (the one that sets
    INSTALLED_APPS and SECRET_KEYS)."""
    guide = (ROOT / "docs" / "webhooks.md").read_text()
    section = guide.partition("\n## Set-up\n")[2].partition("\n## ")[0]
    for block in re.findall(r"```python\n(.*?)```", section, re.S):
        if "INSTALLED_APPS" in block and "SECRET_KEYS" in block:
            return block
    fail('docs/webhooks.md\'s "Set-up" has no python block with INSTALLED_APPS and SECRET_KEYS')
    raise AssertionError  # unreachable


SETTINGS_TAIL = r"""

# -- the webhooks check's substitutions, for a private Redis and database on loopback ---
import os as _os

# the guide's "..." in INSTALLED_APPS: the apps startproject wrote
_guide_apps = [a for a in INSTALLED_APPS if a is not Ellipsis]
INSTALLED_APPS = [a for a in _DJANGO_APPS if a not in _guide_apps] + _guide_apps
# the guide's "default": {...}: any cache; the outbox's alias on the private Redis
CACHES = {
    alias: (config if isinstance(config, dict) else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"})
    for alias, config in CACHES.items()
}
CACHES["outbox"]["LOCATION"] = _os.environ["CHECK_REDIS_URL"]
# the guide's "Trying it on your machine": the receivers are on 127.0.0.1
OUTBOX["ENDPOINTS"]["ALLOW_PRIVATE_NETWORKS"] = True
if _os.environ.get("CHECK_PG_NAME"):
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": _os.environ["CHECK_PG_NAME"],
            "HOST": _os.environ["CHECK_PG_HOST"],
            "PORT": _os.environ["CHECK_PG_PORT"],
            "USER": _os.environ["CHECK_PG_USER"],
        }
    }
"""

DRIVER = r"""
import json, os, random, re, secrets as pysecrets, subprocess, sys, threading, time
from contextlib import nullcontext
from collections import Counter, defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cryptography.fernet import Fernet
from standardwebhooks import Webhook

import outbox as outbox_package
from outbox.testing import RedisServer

started = time.monotonic()
site = os.environ["CHECK_SITE_PACKAGES"]
assert outbox_package.__file__.startswith(site), f"outbox imported from {outbox_package.__file__}, not the wheel in {site}"
EVENTS = int(os.environ["CHECK_EVENTS"])
TYPES = ("order.paid", "order.refunded", "invoice.created", "customer.updated")
CHANNELS = (None, ["eu"], ["us"], ["eu", "us"])
# application uid -> 5 endpoints: (filter_types, channels); the last 2 of each through the admin
PLAN = {
    "acme": [(None, None), (["order.paid"], None), (None, ["eu"]),
             (["order.paid", "order.refunded"], ["eu", "us"]), (["invoice.created"], None)],
    "globex": [(["customer.updated"], None), (None, ["us"]), (["order.refunded", "invoice.created"], ["eu"]),
               (None, None), (["order.paid", "customer.updated"], ["us"])],
    "initech": [(list(TYPES), None), (["invoice.created"], ["eu"]), (None, ["eu", "us"]),
                (["order.refunded"], None), (None, None)],
}
BY_ADMIN = (3, 4)
# PostgreSQL as the test suite finds it (tests/settings.py): trust auth, database test
PG = os.environ.get("OUTBOX_TEST_POSTGRES") or "host=127.0.0.1 port=5432 dbname=test user=postgres"
PG_PARTS = dict(part.split("=", 1) for part in PG.split())
PG_AT = f"{PG_PARTS.get('host', '127.0.0.1')}:{PG_PARTS.get('port', '5432')}"


def say(text):
    print(f"webhooks-check: {text}", flush=True)


# -- the database: a new PostgreSQL database, else SQLite (said why) ----------------------
pg_name = f"outbox_webhooks_check_{pysecrets.token_hex(4)}"
try:
    import psycopg
    with psycopg.connect(PG, connect_timeout=2, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{pg_name}"')
    os.environ.update(CHECK_PG_NAME=pg_name, CHECK_PG_HOST=PG_PARTS.get("host", "127.0.0.1"),
                      CHECK_PG_PORT=PG_PARTS.get("port", "5432"), CHECK_PG_USER=PG_PARTS.get("user", "postgres"))
    database = f"PostgreSQL {pg_name} at {PG_AT}"
except Exception as exc:
    pg_name = None
    database = "SQLite (db.sqlite3)"
    say(f"PostgreSQL does not answer at {PG_AT} ({type(exc).__name__}: {' '.join(str(exc).split())[:200]}): SQLite instead")


class Receiver(ThreadingHTTPServer):
    request_queue_size = 128
    daemon_threads = True


# path -> {"secrets": [each must verify], "refuse": [each must NOT verify]}
verify_with = {}
got = defaultdict(list)          # path -> webhook-ids verified
refused = defaultdict(list)      # path -> why
signatures = defaultdict(list)   # path -> number of signatures per request
lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        headers = {k.lower(): v for k, v in self.headers.items()}
        rule = verify_with.get(self.path)
        status, why = 204, None
        try:
            if rule is None:
                raise ValueError("no endpoint has this path")
            for secret in rule["secrets"]:
                payload = Webhook(secret).verify(body, headers)
            for secret in rule["refuse"]:
                try:
                    Webhook(secret).verify(body, headers)
                except Exception:
                    pass
                else:
                    raise ValueError("verified with a secret whose overlap had ended")
            if payload["type"] != headers.get("outbox-event-type"):
                raise ValueError(f"payload type {payload['type']} under Outbox-Event-Type {headers.get('outbox-event-type')}")
        except Exception as exc:
            status, why = 401, f"{type(exc).__name__}: {exc}"
        with lock:
            if why is None:
                got[self.path].append(headers["webhook-id"])
                signatures[self.path].append(len(headers["webhook-signature"].split()))
            else:
                refused[self.path].append(why)
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


server = Receiver(("127.0.0.1", 0), Handler)
threading.Thread(target=server.serve_forever, daemon=True).start()
base = f"http://127.0.0.1:{server.server_port}"
redis = RedisServer().start()
os.environ.update(CHECK_REDIS_URL=redis.url, OUTBOX_ENDPOINT_KEY=Fernet.generate_key().decode(),
                  DJANGO_SETTINGS_MODULE="site_hooks.settings")


def manage(*args):
    r = subprocess.run([sys.executable, "manage.py", *args], capture_output=True, text=True, timeout=300)
    if r.returncode:
        sys.exit(f"manage.py {' '.join(args)} exited {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    return r.stdout + r.stderr


def burst():
    t0 = time.monotonic()
    manage("outbox_worker", "--burst", "--quiet")
    return time.monotonic() - t0


try:
    say(f"database: {database}")
    manage("migrate", "--verbosity", "0")
    out = manage("check", "--database", "default")
    say("migrate ok; check --database default: " + " | ".join(l.strip() for l in out.splitlines() if l.strip()))

    sys.path.insert(0, os.getcwd())
    import django
    django.setup()
    from django.contrib.auth import get_user_model
    from django.db import connections, transaction
    from django.test import Client

    import outbox
    from outbox import webhooks
    from outbox.models import Application, Endpoint, EventType

    admin = Client(HTTP_HOST="localhost")
    admin.force_login(get_user_model().objects.create_superuser("staff", "staff@example.com", pysecrets.token_hex(8)))

    # a secret on the page that shows it (never a message: its cookie would keep it)
    SHOWN = re.compile(r'id="endpoint-secret-\d+">(whsec_[A-Za-z0-9+/=]+)<')

    def admin_add(model, data):
        r = admin.post(f"/admin/outbox/{model}/add/", data, follow=True)
        page = r.content.decode()
        # saved: a redirect, or (an endpoint) the page that shows its secret
        if r.status_code != 200 or "errorlist" in page or not (r.redirect_chain or 'id="endpoint-secret-1"' in page):
            errors = re.findall(r'<ul class="errorlist[^"]*"[^>]*>(.*?)</ul>', page, re.S)
            sys.exit(f"the admin's {model} add form refused {data}: status {r.status_code}, {errors or page[-1500:]}")
        return page

    # -- the registry: the API and the admin ---------------------------------------------
    for name in TYPES[:3]:
        webhooks.create_event_type(name, description=f"{name} (API)", example={"type": name})
    admin_add("eventtype", {"name": TYPES[3], "description": "through the admin", "schema": "null",
                            "example": json.dumps({"type": TYPES[3]})})
    apps = list(PLAN)
    for uid in apps[:2]:
        webhooks.create_application(uid, name=uid.title())
    admin_add("application", {"uid": apps[2], "name": apps[2].title(), "metadata": "{}", "max_endpoints": ""})
    endpoints = []  # dicts: app, n, path, via, filter_types, channels, pk, secret
    for uid, specs in PLAN.items():
        for n, (types, channels) in enumerate(specs):
            path = f"/hooks/{uid}/{n}"
            row = {"app": uid, "n": n, "path": path, "filter_types": types or [], "channels": channels or []}
            if n in BY_ADMIN:
                page = admin_add("endpoint", {
                    "application": Application.objects.get(uid=uid).pk, "uid": f"{uid}-{n}", "url": base + path,
                    "description": "through the admin", "filter_types": json.dumps(types or []),
                    "channels": json.dumps(channels or []), "rate_limit": "", "max_concurrency": "",
                    "headers": "{}", "metadata": "{}",
                })
                found = SHOWN.findall(page)
                if len(found) != 1 or any(found[0] in c.value for c in admin.cookies.values()):
                    sys.exit(f"the admin did not show the new endpoint's secret once, on its page only: {found}")
                row.update(via="admin", secret=found[0], pk=Endpoint.objects.get(uid=f"{uid}-{n}").pk)
            else:
                created = webhooks.create_endpoint(uid, base + path, uid=f"{uid}-{n}", filter_types=types,
                                                   channels=channels)
                row.update(via="API", secret=created.secret, pk=created.endpoint.pk)
            verify_with[path] = {"secrets": [row["secret"]], "refuse": []}
            endpoints.append(row)
    counts = (EventType.objects.count(), Application.objects.count(), Endpoint.objects.count())
    if counts != (4, 3, 15):
        sys.exit(f"the registry holds {counts} event types, applications, endpoints, not (4, 3, 15)")
    say("registered 4 event types, 3 applications, 15 endpoints (API: 3 types, 2 applications, 9 endpoints; "
        "the admin: 1 type, 1 application, 6 endpoints, their secrets read from the page that showed them once)")

    # -- publish, as the guide's fan-out rules say who gets what ---------------------------
    expected = defaultdict(set)

    def subscribers(app, event_type, channels):
        return [e for e in endpoints if e["app"] == app
                and (not e["filter_types"] or event_type in e["filter_types"])
                and (not e["channels"] or set(e["channels"]) & set(channels or []))]

    def publish(app, event_type, channels, n):
        event = outbox.publish(event_type, {"n": n, "type": event_type, "app": app},
                               application=app, channels=channels)
        mine = subscribers(app, event_type, channels)
        for e in mine:
            expected[e["path"]].add(event.id)
        if sorted(str(d.endpoint_id) for d in event.deliveries) != sorted(str(e["pk"]) for e in mine):
            sys.exit(f"publish({event_type!r}, channels={channels}) to {app} stored deliveries to "
                     f"{sorted(str(d.endpoint_id) for d in event.deliveries)}, the guide's rules say {[e['path'] for e in mine]}")
        return event

    rng = random.Random(34)
    t0 = time.monotonic()
    atomic_events = 0
    for batch in range(0, EVENTS, 50):
        in_transaction = batch % 100 == 50
        with transaction.atomic() if in_transaction else nullcontext():
            for n in range(batch, min(batch + 50, EVENTS)):
                publish(rng.choice(apps), rng.choice(TYPES), rng.choice(CHANNELS), n)
                atomic_events += in_transaction
    deliveries = sum(len(v) for v in expected.values())
    say(f"published {EVENTS} events of 4 types ({atomic_events} inside transaction.atomic): {deliveries} deliveries, "
        f"{time.monotonic() - t0:.1f} s")
    took = burst()
    say(f"outbox_worker --burst: {took:.1f} s")

    # -- rotation: the API (1 hour's overlap, and none), the admin's action (the default) --
    rotated_api = endpoints[0]            # acme #0 (the API): every event
    rotated_admin = endpoints[5 + 3]      # globex #3 (made in the admin): every event
    replaced = endpoints[10 + 4]          # initech #4 (made in the admin): every event
    new_api = webhooks.rotate_secret(rotated_api["pk"], overlap=3600)
    r = admin.post("/admin/outbox/endpoint/", {"action": "rotate_secret", "_selected_action": [str(rotated_admin["pk"])]},
                   follow=True)
    found = SHOWN.findall(r.content.decode())
    if r.status_code != 200 or len(found) != 1 or any(found[0] in c.value for c in admin.cookies.values()):
        sys.exit(f"the admin's rotate action: status {r.status_code}, secrets shown {found}")
    new_admin = found[0]
    new_replaced = webhooks.rotate_secret(replaced["pk"], overlap=0)
    for row, new in ((rotated_api, new_api), (rotated_admin, new_admin)):
        verify_with[row["path"]] = {"secrets": [row["secret"], new], "refuse": []}
    verify_with[replaced["path"]] = {"secrets": [new_replaced], "refuse": [replaced["secret"]]}
    before = {p: len(v) for p, v in expected.items()}
    for n in range(30):
        publish(apps[n % 3], rng.choice(TYPES), rng.choice(CHANNELS), EVENTS + n)
    burst()
    during = {p: len(v) - before[p] for p, v in expected.items()}
    say(f"rotated secrets, then published 30 events: {rotated_api['path']} (the API, 1 hour's overlap) and "
        f"{rotated_admin['path']} (the admin's action, the default overlap) got {during[rotated_api['path']]} and "
        f"{during[rotated_admin['path']]}, each verified with the old and with the new secret; "
        f"{replaced['path']} (the API, no overlap) {during[replaced['path']]}, with the new one only")

    # -- the summary: every endpoint got exactly its events --------------------------------
    problems = []
    head = ("endpoint", "via", "filter_types", "channels", "expected", "received", "missing", "other", "twice", "refused")
    rows = []
    for e in endpoints:
        p = e["path"]
        received = Counter(got[p])
        missing = expected[p] - set(received)
        other = set(received) - expected[p]
        twice = sum(c - 1 for c in received.values())
        rows.append((p, e["via"], ",".join(e["filter_types"]) or "(all)", ",".join(e["channels"]) or "(any)",
                     len(expected[p]), sum(received.values()), len(missing), len(other), twice, len(refused[p])))
        if missing or other or twice or refused[p]:
            problems.append(f"{p}: missing {sorted(missing)[:5]}, other {sorted(other)[:5]}, twice {twice}, "
                            f"refused {refused[p][:3]}")
    stray = {p: v for p, v in refused.items() if p not in {e['path'] for e in endpoints}}
    if stray:
        problems.append(f"requests to no endpoint's path: {stray}")
    for row, want in ((rotated_api, 2), (rotated_admin, 2), (replaced, 1)):
        tail = signatures[row["path"]][-during[row["path"]]:] if during[row["path"]] else []
        if not tail or set(tail) != {want}:
            problems.append(f"{row['path']}: after the rotation, signatures per request {tail}, not {want} each")
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    for line in (head, *rows):
        print("  " + "  ".join(str(x).ljust(w) if i < 4 else str(x).rjust(w) for i, (x, w) in enumerate(zip(line, widths))),
              flush=True)
    total = sum(r[5] for r in rows)
    if problems:
        sys.exit("endpoints that did not get exactly their events:\n" + "\n".join(problems))
    say(f"every endpoint got exactly its events: {total} deliveries verified, each with its endpoint's own secret, "
        f"on {database}, {time.monotonic() - started:.1f} s")
finally:
    try:
        from django.db import connections
        connections.close_all()
    except Exception:
        pass
    redis.stop()
    server.shutdown()
    if pg_name:
        import psycopg
        with psycopg.connect(PG, connect_timeout=5, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{pg_name}" WITH (FORCE)')
"""


def run_check(python: Path, django_admin: Path, site: str, tmp_path: Path, env: dict[str, str]) -> None:
    """Make the project from the guide in ``tmp_path/hooks_project`` and run the driver
    with ``python`` (the new virtualenv's, the wheel installed with psycopg)."""
    t0 = time.monotonic()
    project = tmp_path / "hooks_project"
    project.mkdir()
    result = subprocess.run(
        [str(django_admin), "startproject", "site_hooks", str(project)], capture_output=True, text=True
    )
    if result.returncode:
        fail(f"startproject: {result.stderr[-2000:]}")
    settings = project / "site_hooks" / "settings.py"
    text = settings.read_text().replace("INSTALLED_APPS = [", "_DJANGO_APPS = [", 1)
    settings.write_text(text + "\n" + guide_settings() + SETTINGS_TAIL)
    step('made a new project with docs/webhooks.md\'s "Set-up" block')
    driver = tmp_path / "webhooks_driver.py"
    driver.write_text(textwrap.dedent(DRIVER))
    run_env = {**env, "CHECK_SITE_PACKAGES": site, "CHECK_EVENTS": str(EVENTS)}
    result = subprocess.run(
        [str(python), str(driver)], cwd=project, env=run_env, text=True, capture_output=True
    )
    sys.stdout.write(result.stdout)
    if result.returncode:
        fail(result.stderr[-4000:] or f"driver exited {result.returncode}")
    step(f"ok ({time.monotonic() - t0:.1f} s)")


if __name__ == "__main__":
    sys.exit(
        "run it through scripts/webhooks-check (scripts/package_check.py --webhooks-only builds the wheel first)"
    )
