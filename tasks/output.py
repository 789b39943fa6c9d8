"""Printing for management commands: an aligned table, or JSON with ``--json``."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from django.core.management.base import DjangoHelpFormatter


class HelpFormatter(DjangoHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """``--help`` with the command's own options first, the epilog kept as written, and each real default shown."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        unset = action.default is None or action.default is False or action.default == argparse.SUPPRESS
        if "%(default)" in text or unset or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)" if text else "default: %(default)s"


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    if not rows:
        return "(none)"
    columns = list(columns or rows[0].keys())
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".") if value != int(value) else str(int(value))
    return str(value)


def dumps(data: Any) -> str:
    return json.dumps(data, indent=2, default=str, ensure_ascii=False)
