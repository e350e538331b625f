"""The CLI's one table style, for every listing it prints."""

from __future__ import annotations

from rich.table import Table


def plain_table(
    *columns: str, title: str | None = None, width: int | None = None, fold: bool = False
) -> Table:
    """A table in the CLI's one style: no box, bold headers, a ``title`` on the left;
    ``width`` caps it (80 columns where cells are long), ``fold`` breaks a long cell (an
    id, a path) across lines rather than cutting it short."""
    table = Table(box=None, header_style="bold", title=title, title_justify="left", width=width)
    for column in columns:
        table.add_column(column, overflow="fold" if fold else "ellipsis")
    return table
