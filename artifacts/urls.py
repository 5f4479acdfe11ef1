from django.urls import path

from artifacts import views

urlpatterns = [
    path("query", views.query, name="artifact-query"),
    path("count", views.count, name="artifact-count"),
]
