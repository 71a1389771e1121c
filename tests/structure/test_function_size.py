"""Functions a reader can hold: none longer than :data:`MAX_LINES` lines, none with more
than :data:`MAX_PARAMETERS` parameters (``self`` and ``cls`` not counted) outside the
public API's signatures (``send``, ``publish`` and their twins), which keep their
keyword arguments. Issue 32 set the bar and brought every function under it: there is
no list of exceptions; a function over the bar fails.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "outbox"
MAX_LINES = 79
MAX_PARAMETERS = 7
#: Public signatures exempt from the parameter bar (module, function): ``RedisServer``'s
#: keyword arguments are public API of ``outbox.testing`` (docs/api.md, the changelog), kept
#: as they are like ``send``'s.
PUBLIC = {
    ("outbox/api.py", "send"),
    ("outbox/api.py", "send_many"),
    ("outbox/api.py", "asend"),
    ("outbox/api.py", "asend_many"),
    ("outbox/webhooks.py", "publish"),
    ("outbox/webhooks.py", "apublish"),
    ("outbox/webhooks.py", "create_endpoint"),
    ("outbox/testing/redis_server.py", "__init__"),
}


def measure(package: Path = PACKAGE) -> dict[tuple[str, str, str], int]:
    """Every function over the bar: (path, qualified name, what) -> its figure."""
    found: dict[tuple[str, str, str], int] = {}
    for path in sorted(package.rglob("*.py")):
        if "migrations" in path.parts:
            continue
        shown = str(path.relative_to(package.parent))

        def visit(node: ast.AST, scope: str, shown: str = shown) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    name = f"{scope}{child.name}"
                    if not isinstance(child, ast.ClassDef):
                        lines = (child.end_lineno or child.lineno) - child.lineno + 1
                        if lines > MAX_LINES:
                            found[(shown, name, "lines")] = lines
                        a = child.args
                        params = [
                            p.arg
                            for p in a.posonlyargs + a.args + a.kwonlyargs
                            if p.arg not in ("self", "cls")
                        ]
                        if len(params) > MAX_PARAMETERS and (shown, child.name) not in PUBLIC:
                            found[(shown, name, "parameters")] = len(params)
                    visit(child, f"{name}.")
                else:
                    visit(child, scope)

        visit(ast.parse(path.read_text()), "")
    return found


def test_no_function_is_over_the_bar():
    assert measure() == {}, (
        f"functions over {MAX_LINES} lines or {MAX_PARAMETERS} parameters: split them, or pass "
        "a typed dataclass (never **kwargs or a dict)"
    )


def test_the_measure_sees_a_long_and_a_wide_function(tmp_path):
    package = tmp_path / "outbox"
    package.mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_LINES))
    (package / "m.py").write_text(
        f"def long():\n{body}\n\nclass C:\n    def wide(self, a, b, c, d, e, f, g, h):\n        pass\n"
    )
    assert measure(package) == {
        ("outbox/m.py", "long", "lines"): MAX_LINES + 1,
        ("outbox/m.py", "C.wide", "parameters"): 8,
    }
