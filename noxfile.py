"""The version matrix (issue 9): ``scripts/matrix`` (or ``nox``) runs the test suite on
combinations of Python, Django, RQ and redis-py; docs/compatibility.md holds the results.

    scripts/matrix -l                      # list the sessions
    scripts/matrix -s tests-oldest tests-newest
    scripts/matrix                         # every combination (~20 min on 2 cores)

Not the full cross product (4 × 3 × 2 × 2 = 48 runs) but a covering set: every supported
version of each appears at least once, with the oldest and the newest combination of all.
Django 6.x needs Python 3.12+. Each session installs the project with its test extra and
the pinned versions into its own virtualenv, and runs pytest without the fault scenarios
and the browser test (they do not depend on these versions and take most of the time:
``scripts/test`` runs them). A Python the machine lacks is skipped with a message.
"""

from __future__ import annotations

import os

import nox

#: uv makes the sessions' virtualenvs and installs into them when it is installed beside nox
#: (scripts/matrix and .ci/run install it): 12 s for tests-oldest and tests-newest against
#: 76 s with venv and pip (both with warm caches, measured 2026-11-29); else venv and pip.
nox.options.default_venv_backend = "uv|venv"
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = False

#: (session id, python, Django, RQ, redis-py): pip requirement specifiers. The oldest also
#: pins django-redis and django-rq to their floors (:data:`OLDEST_EXTRA`).
COMBINATIONS = [
    ("oldest", "3.10", "Django==5.2.*", "rq==2.6.1", "redis==5.0.1"),
    ("py3.11-django5.2-rq2-redis6", "3.11", "Django==5.2.*", "rq>=2.6.1,<3", "redis>=6,<7"),
    ("py3.12-django6.0-rq3-redis7", "3.12", "Django==6.0.*", "rq>=3,<4", "redis>=7,<8"),
    ("py3.12-django6.1-rq2-redis5", "3.12", "Django==6.1.*", "rq>=2.6.1,<3", "redis>=5.0.1,<6"),
    ("py3.13-django6.0-rq2-redis8", "3.13", "Django==6.0.*", "rq>=2.6.1,<3", "redis>=8,<9"),
    ("newest", "3.13", "Django==6.1.*", "rq>=3,<4", "redis>=8,<9"),
]

OLDEST_EXTRA = ("django-redis==5.4.*", "django-rq==4.1.*")

#: pytest's processes (pytest-xdist, each with its own private servers): OUTBOX_TEST_PROCESSES
#: as scripts/test reads it, else 4 (the suite mostly waits on its servers and workers).
PROCESSES = ["-n", os.environ.get("OUTBOX_TEST_PROCESSES", "4"), "--dist", "worksteal"]

PYTEST = [
    "-q",
    "-p",
    "no:cacheprovider",
    *PROCESSES,
    "-m",
    "not faults and not browser",
    "-W",
    "error::DeprecationWarning:outbox",
]


#: The console's look in Chromium (marker ``look``): it depends on the Django version
#: (6.1 changed the admin's markup), unlike the rest of the browser tests. The sessions
#: tests-oldest and tests-newest run it with the suite, in the same virtualenv
#: (:data:`PYTEST_WITH_LOOK`); look-oldest and look-newest run it alone. Needs
#: /usr/bin/chromium (scripts/test installs it on CI).
LOOK = ["-q", "-p", "no:cacheprovider", "-m", "look", "tests/console/test_browser_look.py"]
PYTEST_WITH_LOOK = [*PYTEST[:-4], "-m", "not faults and (not browser or look)", *PYTEST[-2:]]


def _run(
    session: nox.Session, django: str, rq: str, redis: str, extra: list[str], pytest: list[str] = PYTEST
) -> None:
    # the docs extra too: a test checks the docs' settings reference with Sphinx's docutils
    # compiled at install: uv does not by default, and where PYTHONDONTWRITEBYTECODE is set
    # every process of the suite then compiled Django and the rest from source again
    session.install("-e", ".[test,server,docs]", django, rq, redis, *extra, env={"UV_COMPILE_BYTECODE": "1"})
    session.run(
        "python",
        "-c",
        "import sys; from importlib.metadata import version as v; print('versions: Python', sys.version.split()[0],"
        " *(f'{p} {v(p)}' for p in ('Django', 'django-redis', 'django-rq', 'rq', 'redis')))",
    )
    session.run("python", "-m", "pytest", *pytest, *session.posargs)


def _define(name: str, python: str, doc: str, *versions: str, pytest: list[str] = PYTEST) -> None:
    """Register nox session ``name``: pytest with ``pytest`` on these pip requirements."""

    def _session(session: nox.Session) -> None:
        _run(session, *versions[:3], list(versions[3:]), pytest)

    _session.__doc__ = doc
    nox.session(name=name, python=python)(_session)


for _id, _python, _django, _rq, _redis in COMBINATIONS:
    _extra = OLDEST_EXTRA if _id == "oldest" else ()
    _ends = _id in ("oldest", "newest")
    _define(
        f"tests-{_id}",
        _python,
        f"Python {_python}, {_django}, {_rq}, {_redis}" + (" (and the console's look)" if _ends else ""),
        _django,
        _rq,
        _redis,
        *_extra,
        pytest=PYTEST_WITH_LOOK if _ends else PYTEST,
    )
    if _id in ("oldest", "newest"):
        _define(
            f"look-{_id}",
            _python,
            f"The console's look in Chromium: Python {_python}, {_django}",
            _django,
            _rq,
            _redis,
            *_extra,
            pytest=LOOK,
        )
