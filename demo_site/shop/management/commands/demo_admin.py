"""``python manage.py demo_admin``: make sure the demo's admin user exists; print its login.

Idempotent. The password is ``--password``, else ``DEMO_ADMIN_PASSWORD``, else one
generated on the first run and kept in ``<DEMO_DATA_DIR>/admin-password`` (so it stays
the same across runs). Prints two lines: ``username: ...`` and ``password: ...``.
"""

from __future__ import annotations

import os
import secrets
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser


class Command(BaseCommand):
    help = "Create or update the demo's superuser and print its username and password."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", default="admin")
        parser.add_argument("--password", default=None)

    def handle(self, *args: Any, **options: Any) -> None:
        password = options["password"] or os.environ.get("DEMO_ADMIN_PASSWORD") or self.stored_password()
        user_model = get_user_model()
        user, _created = user_model.objects.get_or_create(
            username=options["username"], defaults={"email": "admin@example.com"}
        )
        user.is_staff = user.is_superuser = user.is_active = True
        user.set_password(password)
        user.save()
        self.stdout.write(f"username: {user.username}")
        self.stdout.write(f"password: {password}")

    @staticmethod
    def stored_password() -> str:
        """The password kept in the data directory, created on first use."""
        path = settings.DEMO_DATA_DIR / "admin-password"
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        password = secrets.token_urlsafe(9)
        path.write_text(password + "\n")
        path.chmod(0o600)
        return password
