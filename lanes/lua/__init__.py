"""The engine's Lua scripts, each ``<name>.lua`` beside its one typed wrapper ``<name>.py``.

A wrapper (``lanes.lua.sweep.sweep(...)``) is the only code that knows the order
of its script's KEYS and ARGV (documented in the script's header, named in
locals at the script's top) and builds the keys from ``lanes.keys``; callers
pass named values and get a named reply, decoded once. ``loader`` loads and
runs them (``call``: one EVALSHA on a pooled connection; ``ScriptStream``:
admission's calls on one connection).
"""
