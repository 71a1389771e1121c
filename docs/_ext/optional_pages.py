"""Sphinx extension: toctree entries for pages that other work adds later.

``optional_pages`` in ``conf.py`` lists document names (``"metrics"``) that a toctree
may name before the page exists. When the source of a document is read, each toctree
line naming an optional page that has no file yet is dropped, so the toctree slots the
page in the day it is added, and the build (warnings as errors) stays clean before.
"""

from __future__ import annotations

from pathlib import Path


def drop_missing_pages(app, docname: str, source: list[str]) -> None:  # noqa: ANN001
    srcdir = Path(app.srcdir)
    missing = {
        name
        for name in app.config.optional_pages
        if not any((srcdir / f"{name}{suffix}").exists() for suffix in app.config.source_suffix)
    }
    if not missing:
        return
    source[0] = "\n".join(line for line in source[0].split("\n") if line.strip() not in missing)


def setup(app):  # noqa: ANN001, ANN201 (Sphinx's extension signature)
    app.add_config_value("optional_pages", [], "env")
    app.connect("source-read", drop_missing_pages)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
