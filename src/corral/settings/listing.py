"""The settings of a config dataclass as a reader sees them in ``--help``: each field's
name, type, default and range (:mod:`corral.settings.ranges`), then its docstring
(:mod:`corral.settings.docstrings`).

Examples:
    >>> from corral.algos.base import AlgoConfig
    >>> print(list_settings(AlgoConfig, {"lr": 0.001}, notes={"seed": "also --seed"}))
      gamma   float            0.99      in [0, 1]
          Discount per decision of an agent.
      lr      float            0.001     greater than 0
          Adam learning rate.
      hidden  tuple[int, ...]  [64, 64]  at least 1
          Hidden layer sizes of every network.
      seed    int              0         in [0, 18446744073709551615]  (also --seed)
          Seed of network initialisation and exploration.
"""

from __future__ import annotations

import dataclasses
import textwrap
import types
import typing
from collections.abc import Mapping
from typing import Any

from corral.settings.docstrings import field_docs
from corral.settings.ranges import declared_ranges

INDENT, DOC_INDENT = "  ", "      "
PADDED_UP_TO = (24, 16, 12)
"""The name, type and default columns are padded to their widest entry, up to these widths
(a longer entry pushes the rest of its line on); the range and a note follow."""


def list_settings(
    cls: type,
    values: Mapping[str, Any],
    *,
    notes: Mapping[str, str] | None = None,
    width: int = 80,
) -> str:
    """One entry per field of the dataclass ``cls``, in its order: ``name  type  default
    range``, a note where ``notes`` has one, then the field's docstring wrapped to ``width``.

    ``values`` holds the defaults to show (a field it lacks shows the dataclass's own).
    """
    hints = typing.get_type_hints(cls)
    ranges, docs, notes = declared_ranges(cls), field_docs(cls), notes or {}
    rows = []
    for f in dataclasses.fields(cls):
        value = values[f.name] if f.name in values else _dataclass_default(f)
        limits = str(ranges[f.name]) if f.name in ranges else ""
        rows.append([f.name, type_name(hints[f.name]), show_value(value), limits])
    widths = [min(cap, max(len(row[i]) for row in rows)) for i, cap in enumerate(PADDED_UP_TO)]
    entries = []
    for f, row in zip(dataclasses.fields(cls), rows, strict=True):
        cells = [cell.ljust(w) for cell, w in zip(row, widths, strict=False)] + row[3:]
        cells = [cell for cell in cells if cell]
        if f.name in notes:
            cells.append(f"({notes[f.name]})")
        entries.append(INDENT + "  ".join(cells).rstrip())
        for paragraph in docs.get(f.name, "").split("\n\n"):
            entries += textwrap.wrap(
                " ".join(paragraph.split()),
                width,
                initial_indent=DOC_INDENT,
                subsequent_indent=DOC_INDENT,
                break_long_words=False,
                break_on_hyphens=False,
            )
    return "\n".join(entries)


def type_name(annotation: Any) -> str:
    """``annotation`` as a reader types it: ``int | None``, ``raise|restart`` (a
    ``Literal``'s values), ``tuple[int, ...]``, ``any``.

    Examples:
        >>> type_name(typing.Literal["raise", "restart"] | None)
        'raise|restart | None'
    """
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is Any:
        return "any"
    if annotation is type(None):
        return "None"
    if origin is typing.Literal:
        return "|".join(str(arg) for arg in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(arg) for arg in args)
    if origin is not None:
        inner = ", ".join("..." if arg is Ellipsis else type_name(arg) for arg in args)
        return f"{origin.__name__}[{inner}]"
    return getattr(annotation, "__name__", str(annotation))


def show_value(value: Any) -> str:
    """``value`` as ``--set`` reads it back: ``true``, ``None``, ``sync``, ``''``,
    ``[64, 64]``, ``{N: 3}``.

    Examples:
        >>> [show_value(v) for v in (True, None, "sync", "", (64, 64), {"N": 3}, 7e-4)]
        ['true', 'None', 'sync', "''", '[64, 64]', '{N: 3}', '0.0007']
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value or "''"
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(show_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {show_value(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _dataclass_default(f: dataclasses.Field[Any]) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None if f.default is dataclasses.MISSING else f.default
