#!/usr/bin/env python
"""Django's command-line utility for the demo project (``demo_site``).

The demo settings read their Redis from ``REDIS_URL``; ``scripts/demo`` sets it up.
"""

import os
import sys


def main() -> None:
    """Run a management command with ``demo_site.settings`` (unless DJANGO_SETTINGS_MODULE is set)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo_site.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
