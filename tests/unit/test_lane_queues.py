"""Which Celery queues the transport treats as lanes (doorbells): exactly the names a lane may have."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from lanes import keys
from lanes.models import validate_lane_name

NAMES = ["realtime", "bulk-2", "a.b_c", "ingress", "celery", "x:3", "", "a" * 65, "a" * 64,
         "6f1c2d3e-aaaa-bbbb-cccc-0123456789ab.reply.celery.pidbox", "celery.pidbox", "celeryev.123",
         "_kombu.binding.x", "celery-task-meta-1", "chord-unlock", "lane with space"]


@pytest.mark.parametrize("name", NAMES)
def test_a_queue_is_a_lane_exactly_when_a_lane_may_have_its_name(name):
    try:
        validate_lane_name(name)
        valid = True
    except ValidationError:
        valid = False
    # kombu's own keys (unacked, ...) are no queues: a worker never consumes them.
    if name not in {"unacked", "unacked_index", "unacked_mutex"}:
        assert keys.is_lane_queue(name) == valid, name


def test_a_doorbell_is_neither_a_lane_nor_one_of_its_lists():
    bell = keys.lane_doorbell("realtime")
    assert not keys.is_lane_queue(bell) and bell not in keys.lane_queues("realtime")
