"""What an untrusted document may be, and how a refusal is told.

The bounds both loaders (:mod:`tidal.documents` for YAML, :mod:`tidal.documents_json` for
JSON) enforce: :class:`DocumentLimits`, the UTF-8 text's size, the longest integer, and
:class:`DocumentError` with its ``(path, message)`` problems, the path dotted like a
spec's field paths. :mod:`tidal.documents` re-exports the public names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "MAX_DIGITS",
    "SPEC_LIMITS",
    "DocumentError",
    "DocumentLimits",
    "encoded",
    "join_path",
    "shortened_path",
]


#: Longer integers are refused as written: no field needs them, and converting thousands of
#: digits takes quadratic time.
MAX_DIGITS = 100


@dataclass(frozen=True)
class DocumentLimits:
    """How large an untrusted document may be."""

    #: Size of the text in UTF-8 bytes.
    max_bytes: int = 64 * 1024
    #: Nesting of lists and mappings (the top-level mapping is depth 1), through aliases.
    max_depth: int = 32
    #: Lists, mappings and scalars after alias expansion.
    max_nodes: int = 2_000
    #: Aliases (``*name``) used; a spec rarely needs any.
    max_aliases: int = 16


#: What a job spec may be: ample for any real spec (a spec is usually under 1 KiB).
SPEC_LIMITS = DocumentLimits()


class DocumentError(ValueError):
    """A document was refused; ``problems`` lists ``(path, message)`` pairs."""

    def __init__(self, problems: Sequence[tuple[str, str]]) -> None:
        self.problems: list[tuple[str, str]] = list(problems)
        super().__init__("; ".join(f"{p}: {m}" if p else m for p, m in self.problems))


def _key_text(key: object) -> str:
    text = str(key)
    # A path is shown and sent as JSON: escape what cannot be (lone surrogates) or should
    # not be (control characters) shown raw.
    return text if text.isprintable() else repr(text)[1:-1]


def join_path(path: str, key: object) -> str:
    if isinstance(key, int) and not isinstance(key, bool):
        return f"{path}[{key}]"
    return f"{path}.{_key_text(key)}" if path else _key_text(key)


def shortened_path(path: str) -> str:
    # A path thousands of levels deep is no help to read: its start says where it is.
    return path if len(path) <= 64 else path[:60] + "..."


def encoded(text: str | bytes, limits: DocumentLimits) -> bytes:
    """The text as UTF-8 bytes, refused when too large or not UTF-8."""
    if len(text) > limits.max_bytes:  # a cheap first bound: bytes ≥ characters
        raise DocumentError([("", f"document is larger than {limits.max_bytes} bytes")])
    if isinstance(text, bytes):
        data = text
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DocumentError([("", f"not UTF-8 text (byte {exc.start})")]) from None
    else:
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError as exc:
            bad = repr(text[exc.start])[1:-1]
            raise DocumentError([("", f"not UTF-8 text ({bad} at position {exc.start})")]) from None
    if len(data) > limits.max_bytes:
        raise DocumentError(
            [("", f"document is {len(data)} bytes; at most {limits.max_bytes} are allowed")]
        )
    return data
