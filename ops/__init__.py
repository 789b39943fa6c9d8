"""The operator's pages: dashboard, lane controls, ``/metrics``, the Lane admin and ``manage.py lanes``."""
