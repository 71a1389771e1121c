"""``python manage.py outbox_destination {status,pause,resume,disable,enable} [NAME] [--reason]``:
a destination's health, and the operator's actions on it (see :mod:`outbox.destinations.health`).

Examples::

    python manage.py outbox_destination status                 # every destination, one line each
    python manage.py outbox_destination status orders
    python manage.py outbox_destination pause orders --reason "receiver maintenance"
    python manage.py outbox_destination resume orders          # delivers what waited, oldest first
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from outbox.destinations import controls, health
from outbox.exceptions import UnknownDestination

ACTIONS = ("status", "pause", "resume", "disable", "enable")


class Command(BaseCommand):
    help = (
        "Show a destination's health (status, all destinations without NAME), or pause, resume, "
        "disable or enable it. A paused or disabled destination delivers nothing and loses nothing."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=ACTIONS)
        parser.add_argument("name", nargs="?", help="the destination (required but for status)")
        parser.add_argument("--reason", default="", help="why (pause, disable): shown with the state")

    def handle(self, *args: Any, action: str, name: str | None, reason: str, **options: Any) -> None:
        if action == "status":
            known = health.known_destinations()
            if name and name not in known:
                raise CommandError(
                    f"unknown destination {name!r} (configured or used: {', '.join(known) or 'none'})"
                )
            names = [name] if name else known
            for h in health.get_all_health(names).values():
                self.stdout.write(health.status_line(h))
            return
        if not name:
            raise CommandError(f"{action} needs a destination NAME")
        try:
            if action == "pause":
                controls.pause(name, reason=reason)
                self.stdout.write(f"{name}: paused; its messages wait until 'resume'")
            elif action == "disable":
                controls.disable(name, reason=reason)
                self.stdout.write(f"{name}: disabled; its messages wait until 'enable'")
            elif action == "resume":
                moved = controls.resume(name)
                held = health.get_health(name)
                self.stdout.write(
                    f"{name}: resumed; {moved} waiting message(s) queued again"
                    + (
                        f"; its circuit breaker is {held.breaker}: {held.parked} more wait for a probe to succeed"
                        if held.breaker != "closed" and held.parked
                        else ""
                    )
                )
            else:
                moved = controls.enable(name)
                self.stdout.write(f"{name}: enabled; {moved} waiting message(s) queued again")
        except UnknownDestination as exc:
            raise CommandError(str(exc)) from exc
