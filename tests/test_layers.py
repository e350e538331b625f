"""No module of tidal imports itself back, directly or through others.

The layers contract (``[tool.importlinter]`` in pyproject.toml, run by ``make lint``) keeps
packages in order; a cycle between two modules of one package slips through it, and makes
import order matter. Function-level and ``TYPE_CHECKING`` imports count: a lazy import
hides a cycle from Python, not from the reader.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import grimp
import pytest

Graph = dict[str, set[str]]


def cycles(graph: Graph) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan's algorithm,
    iterative: the graph has hundreds of modules)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterable[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(iter(children), None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
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
    return sorted(found)


def tidal_graph() -> Graph:
    """Who imports whom inside tidal (every import, wherever it stands)."""
    g = grimp.build_graph("tidal", cache_dir=None)
    imports: Callable[[str], set[str]] = g.find_modules_directly_imported_by
    return {m: set(imports(m)) for m in g.modules}


def test_no_module_imports_itself_back() -> None:
    found = cycles(tidal_graph())
    assert found == [], "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_search_finds_cycles() -> None:
    # The check above is only as good as the search: a chain with a loop in its middle.
    graph: Graph = {"a": {"b"}, "b": {"c"}, "c": {"b", "d"}, "d": set(), "e": {"e"}}
    assert cycles(graph) == [["b", "c"]]
    assert cycles({"x": {"y"}, "y": {"z"}, "z": {"x"}}) == [["x", "y", "z"]]


def test_names_moved_down_still_import_from_their_old_home_with_a_warning() -> None:
    # Backend plugins (`--backend module:Class`) imported these from backends.base.
    import tidal.backends.base as base
    from tidal.launch import api

    for name in ("JobLaunch", "JobStatus", "WorkerStatus", "WorkerState", "read_reports"):
        if name in vars(base):  # imported there for the Backend protocol itself
            assert getattr(base, name) is getattr(api, name)
            continue
        with pytest.warns(DeprecationWarning, match="import it from tidal.launch.api"):
            assert getattr(base, name) is getattr(api, name)
    with pytest.raises(AttributeError):
        _ = base.NoSuchName
