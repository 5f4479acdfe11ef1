from django.contrib import admin
from django.urls import path

from buzz import views

urlpatterns = [
    path("", views.root, name="root"),
    path("admin/", admin.site.urls),
]
