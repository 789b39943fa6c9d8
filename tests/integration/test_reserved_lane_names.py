"""Lane names kombu's Redis transport owns are refused (issue 12, item 4).

A lane named ``unacked`` (or ``unacked_index``, ``_kombu.binding.x``) made one
of kombu's own keys a list: the recovery sweep then failed with WRONGTYPE for
every lane.
"""

from __future__ import annotations

import pytest

from lanes.models import Lane
from tasks.config_io import apply_config
from tasks.errors import ConfigError

RESERVED = ["unacked", "unacked_index", "unacked_mutex", "_kombu.binding.celery", "_kombu.binding.t-default",
            "_kombu.binding_deadlines", "celeryev.x", "celery.pidbox", "abc.reply.celery.pidbox", "x:3", "x:0"]


@pytest.mark.parametrize("name", RESERVED)
def test_config_import_refuses_a_reserved_lane_name(name):
    with pytest.raises(ConfigError) as err:
        apply_config({"lanes": [{"name": name}]})
    assert f"lanes[0] '{name}'" in str(err.value) and "reserved" in str(err.value)
    assert not Lane.objects.filter(name=name).exists()


@pytest.mark.parametrize("name", RESERVED)
def test_the_admin_refuses_a_reserved_lane_name(admin_client, name):
    reply = admin_client.post("/admin/lanes/lane/add/", {"name": name, "capacity": 10, "accepting": "on",
                                                         "description": ""})
    assert reply.status_code == 200  # the form again, with the error
    assert "reserved" in reply.content.decode()
    assert not Lane.objects.filter(name=name).exists()


def test_ordinary_names_that_merely_resemble_reserved_ones_are_allowed():
    for name in ("unacked-report", "kombu.binding", "pidbox-lane"):
        apply_config({"lanes": [{"name": name}]})
        assert Lane.objects.filter(name=name).exists()
