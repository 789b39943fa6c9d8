"""Built-in handlers; importing this module registers them (``loadtest.sink`` is the tools app's)."""

from tasks.handlers import demo, http  # noqa: F401
