"""URL routes: submit a job (or a voice search), read its status."""

from django.urls import path
from vision import views

urlpatterns = [
    path("jobs/", views.submit, name="submit"),
    path("jobs/<str:job_id>/", views.status, name="status"),
    path("search/", views.search, name="search"),
]
