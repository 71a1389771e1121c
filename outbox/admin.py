"""The outbox console in the Django admin.

"Outbox › Messages" in the admin index leads to the dashboard. The pages live under
the admin (``/admin/outbox/message/`` with the default site) and are named in the
admin site's namespace:

=========================================  ============================  ==========
URL name (``admin:...``)                   path                          method
=========================================  ============================  ==========
``outbox_dashboard``                       ``""``                        GET
``outbox_message_changelist`` (= dashboard)  ``""``                      GET
``outbox_message_list``                    ``messages/``                 GET
``outbox_message_detail``                  ``messages/<id>/``            GET
``outbox_message_change``                  ``messages/<id>/change/``     GET (redirect)
``outbox_message_body``                    ``messages/<id>/body/``       GET
``outbox_message_action``                  ``action/``                   POST
``outbox_message_action_status``           ``action/<job id>/``          GET
``outbox_destination``                     ``destinations/<name>/``      GET
``outbox_destination_action``              ``destinations/<name>/state/``  POST
``outbox_destination_recover``             ``destinations/<name>/recover/``  POST
``outbox_blocked_keys``                    ``destinations/<name>/blocked-keys/``  GET
``outbox_release_key``                     ``destinations/<name>/blocked-keys/release/``  POST
=========================================  ============================  ==========

Permissions (see :mod:`outbox.models`): every page needs ``view_message``; each
action its own ``requeue_message`` (requeue, retry now, recover since, requeue the
head of a blocked ordering key), ``cancel_message`` (cancel, cancel the head of a
blocked ordering key) or ``delete_message``; pausing, resuming, disabling and enabling a
destination needs ``manage_destination``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import update_wrapper
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path

from outbox import models
from outbox.admin_views import confirm, dashboard, destinations, detail, listing, ordering

if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[models.Message]
else:  # Django's ModelAdmin is generic only in its stubs
    _ModelAdmin = admin.ModelAdmin


@admin.register(models.Message)
class MessageAdmin(_ModelAdmin):
    """Admin pages over the messages in Redis (no database rows).

    Attributes:
        list_per_page: rows per page of the message list.
        sync_action_limit: "select all matching" actions on more messages than this
            run as a background RQ job with a progress page; smaller ones run in the
            request (about 10,000 requeues per second; see ``docs``).

    A destination's one state comes from its holds and recent attempts
    (:func:`outbox.destinations.health.destination_state`), not from the messages kept.
    """

    list_per_page = 50
    sync_action_limit = 20_000

    # The admin's own add/change/delete views do not apply: messages are not rows.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        return dashboard.dashboard(self, request)

    def get_urls(self) -> list[URLPattern]:
        def wrap(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
            def bound(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
                return view(self, request, *args, **kwargs)

            return self.admin_site.admin_view(update_wrapper(bound, view))

        return [
            path("", wrap(dashboard.dashboard), name="outbox_dashboard"),
            path("", wrap(dashboard.dashboard), name="outbox_message_changelist"),
            path("messages/", wrap(listing.message_list), name="outbox_message_list"),
            path("messages/<str:message_id>/", wrap(detail.message_detail), name="outbox_message_detail"),
            # The admin history links an entry about one message here (with an admin-quoted id).
            path("messages/<str:object_id>/change/", wrap(detail.history_link), name="outbox_message_change"),
            path("messages/<str:message_id>/body/", wrap(detail.message_body), name="outbox_message_body"),
            path("action/", wrap(confirm.message_action), name="outbox_message_action"),
            path("action/<str:job_id>/", wrap(confirm.action_status), name="outbox_message_action_status"),
            path("destinations/<str:name>/", wrap(destinations.destination_page), name="outbox_destination"),
            path(
                "destinations/<str:name>/state/",
                wrap(destinations.destination_action),
                name="outbox_destination_action",
            ),
            path(
                "destinations/<str:name>/recover/",
                wrap(destinations.destination_recover),
                name="outbox_destination_recover",
            ),
            path(
                "destinations/<str:name>/blocked-keys/",
                wrap(ordering.blocked_keys_page),
                name="outbox_blocked_keys",
            ),
            path(
                "destinations/<str:name>/blocked-keys/release/",
                wrap(ordering.release_key_view),
                name="outbox_release_key",
            ),
        ]
