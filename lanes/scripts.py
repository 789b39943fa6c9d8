"""Alias of ``lanes.lua.loader`` (the Lua loader, renamed by issue 14 so "scripts" means one thing)."""

from __future__ import annotations

from lanes.lua.loader import SCRIPT_DIR, call, script

__all__ = ["SCRIPT_DIR", "call", "script"]
