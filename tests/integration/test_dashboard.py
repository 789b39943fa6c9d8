"""The admin dashboard's pages through Django's test client: access, data, controls with confirmation."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client

from lanes.models import Lane, LaneEvent
from tasks.dispatch import dispatch
from tests.support.helpers import define, unique


@pytest.fixture
def staff_viewer():
    """Staff who may look but not change lanes."""
    user = get_user_model().objects.create_user(unique("viewer"), password="pw-viewer-123", is_staff=True)
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.parametrize("path", ["/admin/dashboard/", "/admin/dashboard/data/",
                                  "/admin/dashboard/lanes/x/close/", "/admin/tasks/deadletter/"])
def test_logged_out_visitors_are_sent_to_the_login_page(path):
    response = Client().get(path)
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/?next=")


def test_dashboard_shows_each_lane_with_its_numbers(admin_client):
    lane, name = unique("d-lane"), unique("d-echo")
    define(name, lane=lane)
    for priority in (9, 1, 1):
        assert dispatch.delay(name, {}, priority=priority).accepted  # no worker: they wait
    assert dispatch.delay(name, "bad").reason == "invalid_payload"
    page = admin_client.get("/admin/dashboard/")
    assert page.status_code == 200
    html = page.content.decode()
    assert f'data-lane="{lane}"' in html and "dashboard.js" in html and "<svg" in html
    assert 'id="flower-link"' in html
    assert f"/admin/tasks/deadletter/?lane__exact={lane}&amp;status__exact=dead" in html

    data = admin_client.get("/admin/dashboard/data/").json()
    row = next(r for r in data["data"]["lanes"] if r["name"] == lane)
    # Issue 13: no worker consumes this lane, and the dashboard says so.
    assert (row["depth"], row["admission"], row["consuming"]) == (3, "open", "no worker")
    assert row["depth_by_priority"]["9"] == 1 and row["depth_by_priority"]["1"] == 2
    assert row["stats"]["counts_15m"]["dispatched"] == 3 and row["stats"]["counts_15m"]["rejected"] == 1
    assert f'data-lane="{lane}"' in data["html"]
    assert any(r["reason"] == "invalid_payload" and r["type"] == name for r in data["data"]["rejections"]["recent"])


def test_closing_a_lane_from_the_dashboard_asks_first_and_is_logged(admin_client):
    lane, name = unique("d-close"), unique("d-close-echo")
    define(name, lane=lane)
    url = f"/admin/dashboard/lanes/{lane}/close/"
    confirm = admin_client.get(url)
    assert confirm.status_code == 200 and b"confirm-button" in confirm.content
    assert Lane.objects.get(name=lane).accepting  # nothing changed before confirming
    done = admin_client.post(url)
    assert done.status_code == 302 and done["Location"] == "/admin/dashboard/"
    assert not Lane.objects.get(name=lane).accepting
    assert dispatch.delay(name, {}).reason == "lane_closed"
    event = LaneEvent.objects.get(lane=lane)
    assert (event.action, event.actor) == ("close", "root")
    admin_client.post(f"/admin/dashboard/lanes/{lane}/open/")
    assert dispatch.delay(name, {}).accepted
    assert admin_client.get(f"/admin/dashboard/lanes/{lane}/explode/").status_code == 404


def test_staff_without_the_permission_sees_no_controls(staff_viewer):
    lane, name = unique("d-view"), unique("d-view-echo")
    define(name, lane=lane)
    html = staff_viewer.get("/admin/dashboard/").content.decode()
    assert f'data-lane="{lane}"' in html and 'data-action="close"' not in html
    assert staff_viewer.post(f"/admin/dashboard/lanes/{lane}/close/").status_code == 403
    assert Lane.objects.get(name=lane).accepting


def test_lane_admin_actions_confirm_before_acting(admin_client):
    lane, name = unique("d-act"), unique("d-act-echo")
    define(name, lane=lane)
    pk = Lane.objects.get(name=lane).pk
    form = {"action": "lane_close", "_selected_action": [pk], "index": 0}
    first = admin_client.post("/admin/lanes/lane/", form)
    assert first.status_code == 200 and b"confirm-button" in first.content
    assert Lane.objects.get(pk=pk).accepting
    second = admin_client.post("/admin/lanes/lane/", {"action": "lane_close", "_selected_action": [pk],
                                                      "confirm": "yes"})
    assert second.status_code == 302
    assert not Lane.objects.get(pk=pk).accepting
    assert dispatch.delay(name, {}).reason == "lane_closed"
    assert LaneEvent.objects.filter(lane=lane, action="close", actor="root").exists()


def test_lane_form_changes_are_logged_too(admin_client):
    lane, name = unique("d-form"), unique("d-form-echo")
    define(name, lane=lane)
    obj = Lane.objects.get(name=lane)
    response = admin_client.post(f"/admin/lanes/lane/{obj.pk}/change/",
                                 {"name": lane, "capacity": 50, "description": ""})  # accepting unticked
    assert response.status_code == 302
    assert LaneEvent.objects.filter(lane=lane, action="close", actor="root").exists()


def test_control_permission_alone_is_enough(staff_viewer):
    user = staff_viewer.session.get("_auth_user_id")
    operator = get_user_model().objects.get(pk=user)
    operator.user_permissions.add(Permission.objects.get(codename="control_lane"))
    lane, name = unique("d-perm"), unique("d-perm-echo")
    define(name, lane=lane)
    assert staff_viewer.post(f"/admin/dashboard/lanes/{lane}/close/").status_code == 302
    assert not Lane.objects.get(name=lane).accepting


def test_flower_auth_endpoint_for_a_reverse_proxy(admin_client, staff_viewer):
    assert Client().get("/admin/flower-auth/").status_code == 401
    assert admin_client.get("/admin/flower-auth/").status_code == 204
    # Issue 12: staff alone is not enough for Flower; the lanes.use_flower permission is.
    assert staff_viewer.get("/admin/flower-auth/").status_code == 403
