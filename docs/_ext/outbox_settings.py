"""Sphinx extension: the settings reference, generated from ``outbox/conf.py``.

The directive ``outbox-settings`` (in MyST: a ```` ```{outbox-settings} ```` fence)
renders one entry per key of :data:`outbox.conf.DEFAULTS`: its name (a link target,
``settings.rst#max-retries`` style anchors come from the headings), its default value as
the code has it, and its meaning from the table in the module docstring of
``outbox/conf.py``. The build fails (an error, not a warning) when a key is in one and
not the other, so the reference cannot drift from the code.
"""

from __future__ import annotations

import pprint
import re

from docutils import nodes
from docutils.parsers.rst import Directive
from docutils.statemachine import StringList
from sphinx.util.nodes import nested_parse_with_titles

TABLE_RULE = re.compile(r"^=+\s+=+\s*$")
KEY = re.compile(r"^``([A-Z_]+)``\s*(.*)$")


def docstring_entries(doc: str) -> dict[str, str]:
    """The ``OUTBOX`` keys table of a module docstring: key -> its text (reST).

    The table is a reST simple table of two columns between rules of ``=``; a row
    starts with ````KEY```` at the left margin, continuation lines are indented.

    Raises:
        ValueError: the docstring has no such table.
    """
    lines = doc.splitlines()
    rules = [i for i, line in enumerate(lines) if TABLE_RULE.match(line)]
    if len(rules) < 2:
        raise ValueError("outbox/conf.py: no settings table (two '=====  ====' rules) in the docstring")
    entries: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in lines[rules[0] + 1 : rules[1]]:
        match = KEY.match(line)
        if match:
            current = entries.setdefault(match.group(1), [])
            if match.group(2):
                current.append(match.group(2).strip())
        elif current is not None and line.strip():
            current.append(line.strip())
    return {key: " ".join(text) for key, text in entries.items()}


def default_text(key: str, value: object) -> str:
    """A default value as Python source, the way a settings file would write it."""
    if key == "EVENTS_CHANNEL" and value == "":
        return '"<KEY_PREFIX>:events" (written "" in DEFAULTS)'
    return pprint.pformat(value, width=88, sort_dicts=False).replace("'", '"')


class OutboxSettingsDirective(Directive):
    has_content = False

    def run(self) -> list[nodes.Node]:
        from outbox import conf

        documented = docstring_entries(conf.__doc__ or "")
        missing = [key for key in conf.DEFAULTS if key not in documented]
        unknown = [key for key in documented if key not in conf.DEFAULTS]
        if missing or unknown:
            raise self.error(
                "outbox/conf.py: the docstring's settings table and DEFAULTS disagree: "
                f"not documented {missing}, documented but not in DEFAULTS {unknown}"
            )
        source = StringList()
        for key, value in conf.DEFAULTS.items():
            rows = [
                f"``{key}``",
                "-" * (len(key) + 4),
                "",
                "Default::",
                "",
                *("   " + line for line in default_text(key, value).splitlines()),
                "",
                documented[key],
                "",
            ]
            for row in rows:
                source.append(row, "outbox/conf.py")
        container = nodes.container()
        nested_parse_with_titles(self.state, source, container)
        return container.children


def setup(app):  # noqa: ANN001, ANN201 (Sphinx's extension signature)
    app.add_directive("outbox-settings", OutboxSettingsDirective)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
