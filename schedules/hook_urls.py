from django.urls import path

from schedules import views

# At the site root: the public webhook endpoint, authenticated only by the request's signature.
urlpatterns = [
    path("hooks/<str:token>", views.webhook, name="webhook"),
]
