"""Untrusted YAML and JSON documents, loaded within bounds.

A job spec arrives from users as text. Text can be built to cost far more than its size:
YAML aliases expand exponentially (a few hundred bytes to billions of nodes), nesting
thousands deep exhausts the interpreter's stack, custom tags build arbitrary objects, and
duplicate keys silently drop values. Every loader here checks, before or while parsing:

- the size in UTF-8 bytes (and that the text *is* UTF-8: no lone surrogates);
- the nesting depth, counted through aliases, without recursion beyond that depth;
- the number of nodes after alias expansion, and the number of aliases; a recursive alias;
- tags: only the plain core types (string, integer, float, boolean, null, list, mapping);
- duplicate keys in a mapping (YAML) or object (JSON), named by their path.

What breaks a bound is a :class:`DocumentError` listing ``(path, message)`` problems, the
path dotted like a spec's field paths (``env.HOME``, ``command[2]``); it is raised within
milliseconds, whatever the input. YAML is parsed by libyaml's C parser when available
(the pure-Python parser is ~20x slower on large documents).

The YAML loader is here; the JSON loader is :mod:`tidal.documents_json`, and the bounds
both share :mod:`tidal.documents_bounds`. Their public names are re-exported here.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent, MappingStartEvent, ScalarEvent, SequenceStartEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.parser import Parser
from yaml.reader import Reader
from yaml.resolver import Resolver
from yaml.scanner import Scanner

from tidal.documents_bounds import (
    MAX_DIGITS,
    SPEC_LIMITS,
    DocumentError,
    DocumentLimits,
    encoded,
    join_path,
    shortened_path,
)
from tidal.documents_json import load_json

__all__ = [
    "SPEC_LIMITS",
    "DocumentError",
    "DocumentLimits",
    "compose_yaml",
    "load_json",
    "load_yaml",
]


class _PyParser(Reader, Scanner, Parser):
    """PyYAML's own event parser."""

    def __init__(self, stream: Any) -> None:
        Reader.__init__(self, stream)
        Scanner.__init__(self)
        Parser.__init__(self)


# libyaml's event parser where PyYAML was built with it; the composer stays in Python (it
# enforces the bounds), the parser and scanner are where the time goes.
try:
    from yaml import cyaml

    _Parser: Any = cyaml.CParser  # type: ignore[attr-defined]
except (ImportError, AttributeError):  # pragma: no cover - PyYAML without libyaml
    _Parser = _PyParser

#: What the libyaml of PyYAML 6.0.4's wheels says of flow collections nested more than
#: 1,000 deep: its scanner looks that far ahead before the composer has counted past its own
#: bound, so the document is read again by PyYAML's parser to say where it went too deep.
_LIBYAML_TOO_DEEP = "exceeded maximum nesting depth"


# --- YAML --------------------------------------------------------------------------------

#: Explicit tags a document may carry: the plain core types, nothing that builds objects.
_PLAIN_TAGS = frozenset(
    f"tag:yaml.org,2002:{name}" for name in ("str", "int", "float", "bool", "null", "seq", "map")
)


_INT_TAG = "tag:yaml.org,2002:int"


class _Resolver(Resolver):
    """YAML 1.1 without base-60 integers, so ``workers: 1:8`` stays the string ``"1:8"``."""


_Resolver.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:int"]
    for first, resolvers in Resolver.yaml_implicit_resolvers.items()
}
_Resolver.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$"),
    list("-+0123456789"),
)


class _BoundedComposer(Composer):
    """PyYAML's composer, counting depth, nodes and aliases as it builds the node graph.

    Each node's expanded size and height are kept, so an alias is charged what it would
    expand to without expanding anything: an alias bomb is refused at the first alias
    that crosses a bound.
    """

    limits: DocumentLimits
    #: From the parser this is mixed with (declared only: no attribute is made here).
    peek_event: Callable[[], Any]

    def _start_bounds(self, limits: DocumentLimits) -> None:
        self.limits = limits
        # Keys from the root to the node being composed (None: no key of its own); joined
        # into a path only when a problem is reported.
        self._keys: list[Any] = []
        self._nodes = 0
        self._aliases = 0
        # id(node) -> (nodes after expansion, height); absent while the node is being built.
        self._sizes: dict[int, tuple[int, int]] = {}

    def _current_path(self, *more: Any) -> str:
        path = ""
        for key in (*self._keys, *more):
            if key is not None:
                path = join_path(path, key)
        return shortened_path(path)

    def _refuse(self, message: str, mark: Any = None) -> DocumentError:
        where = f" (line {mark.line + 1})" if mark is not None else ""
        return DocumentError([(self._current_path(), message + where)])

    def _charge(self, nodes: int, mark: Any) -> None:
        self._nodes += nodes
        if self._nodes > self.limits.max_nodes:
            raise self._refuse(
                f"more than {self.limits.max_nodes} values (counting what aliases repeat)", mark
            )

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        """One node, within the bounds; its path is that of its parent and key."""
        # A sequence's item is at [index], a mapping's value at .key; a mapping's key is
        # shown at the mapping's path.
        self._keys.append(index.value if isinstance(index, ScalarNode) else index)
        try:
            return self._compose_bounded(parent, index)
        finally:
            self._keys.pop()

    def _compose_bounded(self, parent: Node | None, index: Any) -> Node:
        depth = len(self._keys)
        event = self.peek_event()
        if isinstance(event, AliasEvent):
            self._aliases += 1
            if self._aliases > self.limits.max_aliases:
                raise self._refuse(f"more than {self.limits.max_aliases} aliases", event.start_mark)
            target = self.anchors.get(event.anchor)
            if target is not None:
                size = self._sizes.get(id(target))
                if size is None:
                    raise self._refuse(f"alias *{event.anchor} refers to itself", event.start_mark)
                nodes, height = size
                if depth - 1 + height > self.limits.max_depth:
                    raise self._refuse(
                        f"nested more than {self.limits.max_depth} levels deep "
                        f"(through alias *{event.anchor})",
                        event.start_mark,
                    )
                self._charge(nodes, event.start_mark)
            return self._compose_plain(parent, index)
        if isinstance(event, ScalarEvent | SequenceStartEvent | MappingStartEvent):
            tag = event.tag
            if tag not in (None, "!") and tag not in _PLAIN_TAGS:
                shown = tag.replace("tag:yaml.org,2002:", "!!")
                raise self._refuse(f"tag {shown} is not allowed", event.start_mark)
            if depth > self.limits.max_depth and not isinstance(event, ScalarEvent):
                raise self._refuse(
                    f"nested more than {self.limits.max_depth} levels deep", event.start_mark
                )
        self._charge(1, event.start_mark)
        node = self._compose_plain(parent, index)
        if node.tag == _INT_TAG and len(node.value) > MAX_DIGITS:
            raise self._refuse(
                f"a number of {len(node.value)} characters (at most {MAX_DIGITS})",
                event.start_mark,
            )
        children: list[Node] = []
        if isinstance(node, SequenceNode):
            children = node.value
        elif isinstance(node, MappingNode):
            children = [child for pair in node.value for child in pair]
        sizes = [self._sizes[id(child)] for child in children]
        own_height = 0 if isinstance(node, ScalarNode) else 1
        self._sizes[id(node)] = (
            1 + sum(n for n, _ in sizes),
            own_height + max((h for _, h in sizes), default=0),
        )
        return node

    def _compose_plain(self, parent: Node | None, index: Any) -> Node:
        node = super().compose_node(parent, index)
        assert node is not None  # only a document can be empty, not a node
        return node

    def compose_mapping_node(self, anchor: Any) -> MappingNode:
        """A mapping; a key written twice is refused, naming it."""
        node: MappingNode = super().compose_mapping_node(anchor)
        seen: dict[tuple[str, str], int] = {}
        for key, _ in node.value:
            if not isinstance(key, ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
                continue
            line = key.start_mark.line + 1
            if (key.tag, key.value) in seen:
                first = seen[key.tag, key.value]
                raise DocumentError(
                    [
                        (
                            self._current_path(key.value),
                            f"duplicate key (line {line}; first at line {first})",
                        )
                    ]
                )
            seen[key.tag, key.value] = line
        return node


def _start_loader(loader: Any, parser: Any, data: bytes, limits: DocumentLimits) -> None:
    parser.__init__(loader, data)
    _BoundedComposer.__init__(loader)
    SafeConstructor.__init__(loader)
    _Resolver.__init__(loader)
    loader._start_bounds(limits)


class _Loader(_BoundedComposer, _Parser, SafeConstructor, _Resolver):  # type: ignore[misc]
    """libyaml's parser, the bounded composer, PyYAML's safe constructor."""

    def __init__(self, data: bytes, limits: DocumentLimits) -> None:
        _start_loader(self, _Parser, data, limits)


class _PyLoader(_BoundedComposer, _PyParser, SafeConstructor, _Resolver):
    """:class:`_Loader` with PyYAML's own parser (see :data:`_LIBYAML_TOO_DEEP`)."""

    def __init__(self, data: bytes, limits: DocumentLimits) -> None:
        _start_loader(self, _PyParser, data, limits)


def _yaml_problem(exc: yaml.YAMLError) -> DocumentError:
    where = ""
    mark = getattr(exc, "problem_mark", None)
    if mark is not None:
        where = f" at line {mark.line + 1} column {mark.column + 1}"
    problem = getattr(exc, "problem", None) or str(exc)
    return DocumentError([("", f"invalid YAML{where}: {problem}")])


def _run_loader(
    text: str | bytes, limits: DocumentLimits, construct: bool, loader_class: Any = _Loader
) -> Any:
    loader = loader_class(encoded(text, limits), limits)
    try:
        node = loader.get_single_node()
        if not construct or node is None:
            return node
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        if loader_class is not _PyLoader and _LIBYAML_TOO_DEEP in str(exc):
            return _run_loader(text, limits, construct, _PyLoader)
        raise _yaml_problem(exc) from None
    except (ValueError, RecursionError) as exc:  # e.g. int() of a 5,000-digit number
        if isinstance(exc, DocumentError):
            raise
        raise DocumentError([("", f"invalid YAML: {exc}")]) from None
    finally:
        loader.dispose()


def load_yaml(text: str | bytes, limits: DocumentLimits = SPEC_LIMITS) -> Any:
    """The plain data (dicts, lists, str, int, float, bool, None) of one YAML document.

    Raises :class:`DocumentError` for a syntax error or a document beyond ``limits``.
    """
    return _run_loader(text, limits, construct=True)


def compose_yaml(text: str | bytes, limits: DocumentLimits = SPEC_LIMITS) -> Node | None:
    """The node graph of one YAML document (with source positions), within ``limits``."""
    node: Node | None = _run_loader(text, limits, construct=False)
    return node
