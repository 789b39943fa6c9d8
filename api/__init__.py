"""The HTTP API: the ``dispatch`` contract for services that do not import this project."""
