from __future__ import annotations

from django.conf import settings
from drf_spectacular.utils import extend_schema
from rest_framework.decorators import api_view, permission_classes
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response


@extend_schema(responses={200: dict})
@api_view(["GET"])
@permission_classes([AllowAny])
def health(request: Request) -> Response:
    """Liveness and what isolation is in force (never pretends)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    from tasks.isolation import describe_isolation

    return Response({
        "ok": True,
        "database": "postgresql" if settings.DB_IS_POSTGRES else "sqlite",
        "queue": "redis" if settings.REDIS_URL else "orm",
        "live": "redis" if settings.REDIS_URL else "polling",
        "isolation": describe_isolation(),
    })
