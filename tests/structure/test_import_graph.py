"""The floor plan holds (docs/architecture.md, "Floor plan"): no import circle, no import
from a lower layer to a higher one, a reason beside every function-local import, and
Redis commands issued only under ``outbox/store/``.

The graph is grimp's, which reads every import statement: imports inside functions and
under ``TYPE_CHECKING`` count. The layers are the import-linter contracts in
pyproject.toml ([tool.importlinter]), also run by scripts/check.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "outbox"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The import circles of ``graph``: its strongly connected components of more than one
    module (Tarjan's algorithm, iterative), each sorted, the list sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return sorted(found)


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("outbox", cache_dir=None)


def test_no_import_circle(graph):
    assert circles(graph) == []


def test_an_injected_circle_is_found():
    injected = grimp.build_graph("outbox", cache_dir=None)
    # records is a leaf; the front door imports it: one import back closes a circle
    injected.add_import(importer="outbox.records", imported="outbox.api")
    found = circles(injected)
    assert len(found) == 1 and {"outbox.records", "outbox.api"} <= set(found[0])


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(root / "pyproject.toml"), "--no-cache"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_no_import_runs_up_a_layer():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_an_injected_upward_import_breaks_the_layers(tmp_path):
    shutil.copytree(PACKAGE, tmp_path / "outbox", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    store = tmp_path / "outbox" / "store" / "keys.py"
    # inside a function, as the imports that closed the old circle were
    store.write_text(
        store.read_text() + "\n\ndef _injected():\n    from outbox.delivery import loop  # noqa\n"
    )
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    assert "outbox.store is not allowed to import outbox.delivery" in result.stdout, result.stdout


def test_an_import_up_the_store_s_rooms_breaks_its_contract(tmp_path):
    shutil.copytree(PACKAGE, tmp_path / "outbox", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    routing = tmp_path / "outbox" / "store" / "client" / "routing.py"
    # the Redis client below the repository: it must not reach up for it
    routing.write_text(
        routing.read_text() + "\n\ndef _injected():\n    from outbox.store import repository  # noqa\n"
    )
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    assert "outbox.store.client is not allowed to import outbox.store.repository" in result.stdout, (
        result.stdout
    )


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def python_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts)


def local_imports(path: Path) -> list[tuple[int, str]]:
    """(line, text of the statement) of each import inside a function of ``path``, outside
    ``if TYPE_CHECKING:``."""
    source = path.read_text()
    lines = source.splitlines()
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append((child.lineno, "\n".join(lines[child.lineno - 1 : child.end_lineno])))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    visit(ast.parse(source), False)
    return found


def test_every_function_local_import_says_why():
    silent = [
        f"{shown(path)}:{line}: {text.strip()}"
        for path in python_files()
        for line, text in local_imports(path)
        if "#" not in text
    ]
    assert silent == [], "a function-local import needs its reason on the same line:\n" + "\n".join(silent)


def test_the_local_import_check_sees_a_silent_one(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    import json\n\n\ndef g():\n    import os  # why\n")
    assert [line for line, _ in local_imports(module)] == [2, 6]


#: What only store/ may do: get the outbox's Redis client or send a command to one
#: (``redis.exceptions`` may be caught anywhere; a client may be handed to RQ).
REDIS_USE = re.compile(
    r"^\s*(import django_redis|from django_redis)"
    r"|import[^\n]*\bget_connection\b|\bget_redis_connection\("
    r"|\.pipeline\(|\.execute_command\(|\.evalsha\(|\.connection\.\w+\(",
    re.M,
)


def redis_use(path: Path) -> list[str]:
    return [
        f"{shown(path)}:{path.read_text()[: m.start()].count(chr(10)) + 1}: {m.group(0).strip()}"
        for m in REDIS_USE.finditer(path.read_text())
    ]


def test_redis_commands_are_issued_only_under_store():
    outside = [
        hit
        for path in python_files()
        if "store" not in path.relative_to(PACKAGE).parts
        for hit in redis_use(path)
    ]
    assert outside == [], "Redis used outside outbox/store/:\n" + "\n".join(outside)


def test_the_redis_check_sees_a_pipeline(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f(repo):\n    pipe = repo.connection.pipeline()\n")
    assert redis_use(module)


def test_the_admin_model_is_always_written_models_message():
    # outbox.records.Message is the message record; outbox.models.Message, the unmanaged
    # model that gives the console its URLs and permissions, is never imported by that
    # name (module-qualified, or under an alias such as MessageModel).
    by_name = [
        shown(path)
        for path in python_files() + sorted((ROOT / "tests").rglob("*.py"))
        if re.search(r"from outbox\.models import [^\n]*\bMessage\b(?!\s+as\s+\w)", path.read_text())
    ]
    assert by_name == []
