from django.contrib import admin
from django.urls import include, path

from buzz.web import api, views

urlpatterns = [
    path("", views.root, name="root"),
    path("events", api.post_event, name="post-event"),
    path("api/unread", api.unread, name="unread"),
    path("api/mentions", api.mentions, name="mentions"),
    path("api/channels/<str:channel_id>/counts", api.channel_counts, name="channel-counts"),
    path("api/channels/<str:channel_id>/read", api.mark_read, name="mark-read"),
    path("api/channels/<str:channel_id>/threads/<str:root_id>", api.thread_counts, name="thread-counts"),
    path("", include("artifacts.urls")),
    path("admin/", admin.site.urls),
]
