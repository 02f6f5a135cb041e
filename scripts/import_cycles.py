"""Fail when any modules of a package import each other in a cycle (directly or through others).

Usage: python scripts/import_cycles.py PACKAGE. Builds the import graph with grimp (what
import-linter uses) and prints every strongly connected component of more than one module."""

from __future__ import annotations

import sys

import grimp


def cycles(package: str) -> list[list[str]]:
    graph = grimp.build_graph(package)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in sorted(graph.modules)}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(root: str) -> None:  # Tarjan's algorithm, iteratively
        work = [(root, iter(edges[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))

    for module in edges:
        if module not in index:
            visit(module)
    return found


def main() -> int:
    package = sys.argv[1] if len(sys.argv) > 1 else "tflaunch"
    found = cycles(package)
    for component in found:
        print("import cycle: " + " ↔ ".join(component))
    print(f"{package}: {len(found)} import cycle(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
