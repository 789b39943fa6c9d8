"""A small client for the HTTP API in tests: Django's test client with a bearer token and JSON bodies."""

from __future__ import annotations

import json
from typing import Any

from django.test import Client


def make_token(name: str, types: list[str], **kwargs: Any) -> str:
    from api.models import ServiceToken

    _, clear = ServiceToken.objects.issue(name, types, **kwargs)
    return clear


class ApiClient:
    def __init__(self, token: str | None) -> None:
        self.token = token
        self.client = Client(raise_request_exception=False)

    def _headers(self) -> dict[str, str]:
        return {"HTTP_AUTHORIZATION": f"Bearer {self.token}"} if self.token else {}

    def post(self, path: str, data: Any = None, *, raw: str | bytes | None = None, **extra: Any):
        content = raw if raw is not None else json.dumps(data)
        return self.client.post(f"/api/v1{path}", data=content, content_type="application/json",
                                **self._headers(), **extra)

    def get(self, path: str, **extra: Any):
        return self.client.get(f"/api/v1{path}", **self._headers(), **extra)
