#!/usr/bin/env python3
"""Print where a test run's time went, from what ``pytest -p tests.costs --costs DIR`` recorded.

    python scripts/test_costs.py DIR [--top N] [--by cpu|wall] [--markdown] [--against BEFORE]

Merges every worker's ``DIR/*.jsonl`` and prints each module's and then each test's wall and CPU
seconds (CPU = the pytest process's own + its waited-for children's), most expensive first, and
the workers' totals (with what no test accounts for: collection, start-up, hooks). With
``--against BEFORE`` (another run's folder) it prints the modules of both runs side by side.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path


def load(folder: Path) -> tuple[list[dict], list[dict]]:
    tests, sessions = [], []
    files = sorted(folder.glob("*.jsonl"))
    if not files:
        raise SystemExit(
            f"test_costs: no *.jsonl in {folder}: run pytest -p tests.costs --costs {folder}"
        )
    for path in files:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                print(f"test_costs: {path}:{number}: not JSON, skipped", file=sys.stderr)
                continue
            (sessions if "session" in record else tests).append(record)
    # A test run again (a file that sorts later, e.g. main.jsonl of a rerun after gw*.jsonl)
    # replaces its earlier record.
    latest = {t["test"]: t for t in tests}
    if len(latest) < len(tests):
        print(
            f"test_costs: {len(tests) - len(latest)} record(s) replaced by later runs",
            file=sys.stderr,
        )
    return list(latest.values()), sessions


def by_module(tests: list[dict]) -> list[dict]:
    modules: dict[str, dict] = defaultdict(
        lambda: {"tests": 0, "wall": 0.0, "self": 0.0, "children": 0.0, "workers": set()}
    )
    for t in tests:
        m = modules[t["module"]]
        m["tests"] += 1
        m["workers"].add(t.get("worker", "?"))
        for key in ("wall", "self", "children"):
            m[key] += t[key]
    return [{"module": name, **m} for name, m in modules.items()]


def cpu(record: dict) -> float:
    return record["self"] + record["children"]


def table(rows: list[dict], name: str, markdown: bool) -> list[str]:
    head = (name, "tests", "wall s", "CPU s", "own", "children")
    lines = []
    if markdown:
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
    else:
        lines.append(
            f"{head[0]:<70} {head[1]:>5} {head[2]:>8} {head[3]:>8} {head[4]:>7} {head[5]:>8}"
        )
    for r in rows:
        cells = (
            r[name],
            str(r.get("tests", 1)),
            f"{r['wall']:.1f}",
            f"{cpu(r):.1f}",
            f"{r['self']:.1f}",
            f"{r['children']:.1f}",
        )
        if markdown:
            lines.append("| " + " | ".join(cells) + " |")
        else:
            lines.append(
                f"{cells[0][:70]:<70} {cells[1]:>5} {cells[2]:>8} {cells[3]:>8} {cells[4]:>7} "
                f"{cells[5]:>8}"
            )
    return lines


def compare(
    before: list[dict], after: list[dict], by, top: int | None, markdown: bool
) -> list[str]:
    """Modules of two runs side by side, by the larger of their two costs."""
    old = {m["module"]: m for m in by_module(before)}
    new = {m["module"]: m for m in by_module(after)}
    names = sorted(
        old.keys() | new.keys(),
        key=lambda n: max(by(old[n]) if n in old else 0, by(new[n]) if n in new else 0),
        reverse=True,
    )[:top]
    head = ("module", "tests", "wall s", "CPU s", "tests after", "wall s after", "CPU s after")
    lines = (
        ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        if markdown
        else [f"{head[0]:<60} " + " ".join(f"{h:>12}" for h in head[1:])]
    )
    for name in names:
        cells = [name]
        for side in (old, new):
            m = side.get(name)
            cells += [str(m["tests"]), f"{m['wall']:.1f}", f"{cpu(m):.1f}"] if m else ["-"] * 3
        if markdown:
            lines.append("| " + " | ".join(cells) + " |")
        else:
            lines.append(f"{cells[0][:60]:<60} " + " ".join(f"{c:>12}" for c in cells[1:]))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--top", type=int, default=20, help="rows per table (0: all)")
    parser.add_argument("--by", choices=("cpu", "wall"), default="cpu", help="sort key")
    parser.add_argument("--markdown", action="store_true", help="tables as Markdown")
    parser.add_argument(
        "--against", type=Path, help="an earlier run's folder: modules side by side"
    )
    args = parser.parse_args(argv)
    tests, sessions = load(args.folder)
    key = cpu if args.by == "cpu" else (lambda r: r["wall"])
    top = args.top or None
    if args.against:
        before, _ = load(args.against)
        print("\n".join(compare(before, tests, key, top, args.markdown)))
        return 0

    modules = sorted(by_module(tests), key=key, reverse=True)
    ordered = sorted(tests, key=key, reverse=True)
    total_wall = sum(t["wall"] for t in tests)
    total_cpu = sum(cpu(t) for t in tests)
    out = [
        f"{len(tests)} tests in {len(modules)} modules: {total_wall:.0f} s of test wall time "
        f"(summed over workers), {total_cpu:.0f} s of CPU (own + waited-for children)",
        "",
        f"Modules by {args.by}:",
        *table(modules[:top], "module", args.markdown),
        "",
        f"Tests by {args.by}:",
        *table(ordered[:top], "test", args.markdown),
    ]
    if sessions:
        out += ["", "Workers (whole session; 'outside tests' = collection, start-up, hooks):"]
        for s in sorted(sessions, key=lambda s: s["session"]):
            mine = [t for t in tests if t.get("worker") == s["session"]]
            inside_wall = sum(t["wall"] for t in mine)
            inside_cpu = sum(cpu(t) for t in mine)
            out.append(
                f"  {s['session']}: {len(mine)} tests, wall {s['wall']:.0f} s "
                f"({s['wall'] - inside_wall:.0f} outside tests), CPU {cpu(s):.0f} s "
                f"({cpu(s) - inside_cpu:.0f} outside tests)"
            )
    failed = [t for t in tests if t.get("outcome") not in ("passed", "skipped")]
    if failed:
        out += ["", f"Not passed ({len(failed)}):"] + [
            f"  {t['outcome']}: {t['test']}" for t in failed
        ]
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
