"""Built-in handlers; importing this module registers them."""

from tasks.handlers import demo, http, sink  # noqa: F401
