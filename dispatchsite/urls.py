from django.conf import settings
from django.contrib import admin
from django.urls import path, re_path
from django.views.generic import RedirectView

from api import views as api_views
from ops import views as lane_views

urlpatterns = [
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
    path("metrics", lane_views.metrics_view, name="dispatch-metrics"),
    # Inside the admin (staff only; a logged-out visitor is sent to the admin login).
    path("admin/dashboard/", admin.site.admin_view(lane_views.dashboard), name="dispatch-dashboard"),
    path("admin/dashboard/data/", admin.site.admin_view(lane_views.dashboard_data), name="dispatch-dashboard-data"),
    path("admin/dashboard/tasks/", admin.site.admin_view(lane_views.task_search), name="dispatch-task-search"),
    path("admin/dashboard/lanes/<str:name>/purge/", admin.site.admin_view(lane_views.lane_purge),
         name="dispatch-lane-purge"),
    path("admin/dashboard/lanes/<str:name>/<str:action>/", admin.site.admin_view(lane_views.lane_control),
         name="dispatch-lane-control"),
    # For a reverse proxy in front of Flower (nginx auth_request): 204 for staff, 401 otherwise.
    path("admin/flower-auth/", lane_views.flower_auth, name="dispatch-flower-auth"),
    path("admin/tasks/history/<str:task_id>/", admin.site.admin_view(lane_views.task_history),
         name="dispatch-task-history"),
    path("admin/", admin.site.urls),
    # The HTTP API for services that do not import this project (api/); JSON 404 for any other /api/ path.
    path("api/v1/", api_views.api.urls),
    re_path(r"^api/", api_views.not_found, name="api-not-found"),
]
if settings.DISPATCH_TOOLS:  # the demo receiver chat.send posts to on a development install
    from tools import demo_hook

    urlpatterns.insert(1, path(demo_hook.PATH, demo_hook.receive, name="dispatch-demo-hook"))

admin.site.site_header = "Dispatch administration"
admin.site.site_title = "Dispatch"
admin.site.index_title = "Lanes, task types and dead letters"
