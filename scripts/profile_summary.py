"""Summarize py-spy raw (collapsed) profiles written by ``manage.py benchmark --profile DIR``.

Usage: python scripts/profile_summary.py DIR/noop-platform-worker0.txt [...] [--top 25] [--match TEXT]

Per process role (the worker's main process vs its pool children), prints the
share of samples by the innermost project/library frame (self time) and by
selected inclusive frames.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter, defaultdict

FRAME = re.compile(r"^(?P<func>.+) \((?P<file>[^:()]+)(?::\d+)?\)$")


def load(paths: list[str]) -> dict[str, list[tuple[list[str], int]]]:
    by_proc: dict[str, list[tuple[list[str], int]]] = defaultdict(list)
    for path in paths:
        roots: dict[str, str] = {}
        for line in open(path, encoding="utf-8", errors="replace"):
            stack, _, n = line.rstrip("\n").rpartition(" ")
            frames = stack.split(";")
            proc = frames[0].split(":", 1)[0] if frames[0].startswith("process ") else "?"
            role = roots.setdefault(proc, "main" if not roots else "child")
            by_proc[role].append(([f for f in frames[1:]], int(n)))
    return by_proc


def short(frame: str) -> str:
    m = FRAME.match(frame)
    if not m:
        return frame
    file = m.group("file")
    for cut in ("site-packages/", "/work/main/"):
        if cut in file:
            file = file.split(cut, 1)[1]
    return f"{m.group('func')} ({file})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--match", action="append", default=[], help="report inclusive share of frames containing TEXT")
    args = ap.parse_args()
    for role, stacks in load(args.paths).items():
        total = sum(n for _, n in stacks)
        print(f"== {role}: {total} samples")
        selfs: Counter = Counter()
        incl: Counter = Counter()
        for frames, n in stacks:
            if frames:
                selfs[short(frames[-1])] += n
            seen = set()
            for f in frames:
                s = short(f)
                if s not in seen:
                    seen.add(s)
                    incl[s] += n
        print("  inclusive (top):")
        for name, n in incl.most_common(args.top * 3):
            if any(m in name for m in args.match) or not args.match:
                print(f"    {100 * n / total:5.1f}%  {name}")
        print("  self (top):")
        for name, n in selfs.most_common(args.top):
            print(f"    {100 * n / total:5.1f}%  {name}")


if __name__ == "__main__":
    main()
