"""Sphinx configuration of the django-redis-outbox documentation site.

Build it with ``scripts/docs`` (warnings are errors). Pages are Markdown read by
MyST-Parser; the API reference comes from the docstrings (autodoc) and the settings
reference from ``outbox/conf.py`` itself (``docs/_ext/outbox_settings.py``), so
neither can drift from the code.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import django

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path[:0] = [str(ROOT), str(DOCS / "_ext"), str(DOCS)]

# autodoc imports the modules, and Django models and settings need a configured Django.
os.environ["DJANGO_SETTINGS_MODULE"] = "tests.import_settings"
django.setup()

from outbox.version import __version__  # noqa: E402

project = "django-redis-outbox"
author = "django-redis-outbox developers"
copyright = "django-redis-outbox developers"  # noqa: A001
version = release = __version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "outbox_settings",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "snippets"]
templates_path: list[str] = []

# MyST: ``:::{note}`` fences, ``{ref}`` roles, anchors for the headings of every page
# (so ``[text](operations.md#redis)`` links are checked at build time).
myst_enable_extensions = ["colon_fence", "deflist", "fieldlist"]
myst_heading_anchors = 3

# Google-style docstrings (Args:, Returns:, Raises:) as the code writes them.
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autodoc_default_options = {"show-inheritance": True}
# Type names in signatures that are not documented here (Django, redis-py, the standard
# library without intersphinx, which would need the network) are not link targets.
nitpicky = False


html_theme = "furo"
html_title = f"django-redis-outbox {release}"
html_static_path: list[str] = []  # no static files of our own (screenshots live in docs/screenshots)
html_theme_options = {"navigation_with_keys": True}
