"""Server-side SVG charts for the dashboard: no JavaScript library, no CDN, works offline (pure)."""

from __future__ import annotations

from html import escape

from ops.metrics import SAMPLE_INTERVAL_S

WAITING_COLOUR = "#2f6fb0"
THROUGHPUT_COLOUR = "#2e9b4f"


def _nice_max(value: float) -> float:
    """A round axis top at or above ``value`` (1, 2, 5 x 10^n)."""
    if value <= 0:
        return 1.0
    magnitude = 10 ** len(str(int(value))) / 10 if value >= 1 else 1.0
    if value < 1:
        for top in (0.1, 0.2, 0.5, 1.0):
            if value <= top:
                return top
    for step in (1, 2, 5, 10):
        if value <= step * magnitude:
            return float(step * magnitude)
    return float(value)


def _fmt(value: float) -> str:
    if value >= 100 or value == int(value):
        return f"{value:.0f}"
    return f"{value:.1f}" if value >= 1 else f"{value:.2f}"


def _segments(points: list[tuple[float, float | None]], max_gap: float) -> list[list[tuple[float, float]]]:
    """Split a series where a value is missing or samples are too far apart."""
    segments: list[list[tuple[float, float]]] = []
    current: list[tuple[float, float]] = []
    last_t = None
    for t, v in points:
        if v is None or (last_t is not None and t - last_t > max_gap):
            if current:
                segments.append(current)
            current = []
        if v is not None:
            current.append((t, v))
        last_t = t
    if current:
        segments.append(current)
    return segments


def lane_chart(lane: str, series: list[dict], now: float, window_s: float = 900.0,
               width: int = 420, height: int = 120) -> str:
    """Waiting tasks (left axis) and completions per second (right axis) over the last ``window_s``."""
    left, right, top, bottom = 34, 40, 16, 18
    plot_w, plot_h = width - left - right, height - top - bottom
    start = now - window_s
    visible = [p for p in series if p["t"] >= start]
    waiting_max = _nice_max(max((p["waiting"] for p in visible), default=0))
    rate_max = _nice_max(max((p["throughput"] or 0 for p in visible), default=0))

    def x(t: float) -> float:
        return left + (t - start) / window_s * plot_w

    def y(v: float, top_value: float) -> float:
        return top + plot_h - min(1.0, v / top_value) * plot_h

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="lane-chart" data-lane="{escape(lane)}" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{escape(lane)}: waiting and completed per second, last {int(window_s // 60)} minutes">',
        f'<title>{escape(lane)}: waiting (blue, left) and completed/s (green, right)</title>',
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="#fafafa" stroke="#ddd"/>',
    ]
    for frac in (0.5,):
        gy = top + plot_h * frac
        parts.append(f'<line x1="{left}" y1="{gy:.1f}" x2="{left + plot_w}" y2="{gy:.1f}" stroke="#eee"/>')
    max_gap = 4 * SAMPLE_INTERVAL_S
    waiting_pts = [(p["t"], float(p["waiting"])) for p in visible]
    rate_pts = [(p["t"], p["throughput"]) for p in visible]
    for pts, colour, top_value, cls in ((waiting_pts, WAITING_COLOUR, waiting_max, "waiting"),
                                        (rate_pts, THROUGHPUT_COLOUR, rate_max, "throughput")):
        for seg in _segments(pts, max_gap):
            if len(seg) == 1:
                t, v = seg[0]
                parts.append(f'<circle class="{cls}" cx="{x(t):.1f}" cy="{y(v, top_value):.1f}" r="1.5" '
                             f'fill="{colour}"/>')
                continue
            coords = " ".join(f"{x(t):.1f},{y(v, top_value):.1f}" for t, v in seg)
            parts.append(f'<polyline class="{cls}" points="{coords}" fill="none" stroke="{colour}" '
                         f'stroke-width="1.6"/>')
    parts += [
        f'<text x="{left - 4}" y="{top + 8}" font-size="10" text-anchor="end" fill="{WAITING_COLOUR}">'
        f'{_fmt(waiting_max)}</text>',
        f'<text x="{left - 4}" y="{top + plot_h}" font-size="10" text-anchor="end" fill="{WAITING_COLOUR}">0</text>',
        f'<text x="{left + plot_w + 4}" y="{top + 8}" font-size="10" fill="{THROUGHPUT_COLOUR}">'
        f'{_fmt(rate_max)}/s</text>',
        f'<text x="{left + plot_w + 4}" y="{top + plot_h}" font-size="10" fill="{THROUGHPUT_COLOUR}">0</text>',
        f'<text x="{left}" y="{height - 4}" font-size="10" fill="#666">-{int(window_s // 60)}m</text>',
        f'<text x="{left + plot_w}" y="{height - 4}" font-size="10" text-anchor="end" fill="#666">now</text>',
        f'<text x="{left}" y="11" font-size="11" fill="{WAITING_COLOUR}">waiting</text>',
        f'<text x="{left + plot_w}" y="11" font-size="11" text-anchor="end" fill="{THROUGHPUT_COLOUR}">'
        'completed/s</text>',
    ]
    if not visible:
        parts.append(f'<text x="{left + plot_w / 2}" y="{top + plot_h / 2}" font-size="11" text-anchor="middle" '
                     'fill="#999">no samples yet (a worker records one every few seconds)</text>')
    parts.append("</svg>")
    return "".join(parts)
