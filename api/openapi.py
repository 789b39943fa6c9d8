"""The API's OpenAPI schema as the committed text (``docs/openapi.json``): sorted keys, two-space indent."""

from __future__ import annotations

import json
from typing import Any


def schema() -> dict[str, Any]:
    from api.views import api

    return json.loads(json.dumps(api.get_openapi_schema(), default=str))


def schema_text() -> str:
    return json.dumps(schema(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
