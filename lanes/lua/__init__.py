"""The engine's Lua scripts, each ``<name>.lua`` beside its one typed wrapper ``<name>.py``.

A wrapper (``lanes.lua.admit.admit(...)``) is the only code that knows the order
of its script's KEYS and ARGV (documented in the script's header) and builds
the keys from ``lanes.keys``; callers pass named values. ``loader`` loads and
runs them (``call``: one EVALSHA on a pooled connection).
"""
