"""A service that does not import the project: only ``celery``, as the README shows.

Run as a script (``python -I bare_celery_client.py BROKER TYPE PAYLOAD_JSON [QUEUE]``),
it sends ``tasks.dispatch`` by name and prints the message's id and whether any of
the project's modules were imported (none must be; celery may load parts of Django by itself).
"""

from __future__ import annotations

import json
import sys

from celery import Celery


def main() -> None:
    broker, task_type, payload = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    options = {"queue": sys.argv[4]} if len(sys.argv) > 4 else {}
    app = Celery(broker=broker)
    result = app.send_task("tasks.dispatch", args=[task_type, payload], kwargs={"priority": 6}, **options)
    leaked = sorted(m for m in sys.modules if m.split(".")[0] in {"dispatchsite", "tasks", "lanes", "api"})
    print(json.dumps({"id": result.id, "leaked": leaked}))


if __name__ == "__main__":
    main()
