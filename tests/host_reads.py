"""Counting host reads of torch tensors on the CPU: the calls that synchronise a GPU.

On a GPU, a call that needs a tensor's values on the host (``.item()``,
``bool()``, ``.tolist()``, ``.cpu()``...), or that needs them to know the shape
of its result (``nonzero``, ``argwhere``, ``masked_select``, ``unique``,
one-argument ``torch.where``, indexing by a bool tensor), waits for the device.
:func:`counting_reads` counts such calls on any device, so that a CPU-only
machine checks what ``torch.cuda.set_sync_debug_mode("error")`` checks on a GPU.
"""

from __future__ import annotations

import contextlib
import sys
from collections import Counter
from collections.abc import Iterator

import torch

READS = (
    "__bool__",
    "__int__",
    "__float__",
    "__index__",
    "__array__",
    "item",
    "tolist",
    "numpy",
    "cpu",
)
"""Tensor methods that read a tensor's values back to the host (or, ``cpu``, move it there)."""

SIZED_BY_VALUES = ("nonzero", "argwhere", "masked_select", "unique")
"""Tensor methods and ``torch`` functions whose result's shape depends on the values."""

HELPERS = ("corral.arrays",)
"""Modules whose reads are their caller's (``to_numpy`` reads for whoever calls it)."""


def _has_bool_index(index: object) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


def _caller(skip: tuple[str, ...], host_side: tuple[str, ...]) -> str | None:
    """The innermost ``corral`` function on the stack (:data:`HELPERS` aside), as
    ``module:function``; ``None`` where it is one of ``skip`` or a ``host_side`` module
    comes first (its reads are not counted)."""
    frame = sys._getframe(2)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.startswith(host_side):
            return None
        if module.startswith("corral.") and module not in HELPERS:
            if module.startswith(skip):
                return None
            return f"{module}:{frame.f_code.co_name}"
        frame = frame.f_back
    return "(outside corral)"


@contextlib.contextmanager
def counting_reads(
    skip: tuple[str, ...] = (), host_side: tuple[str, ...] = ()
) -> Iterator[Counter[str]]:
    """Count host reads of tensors (see the module's docstring) by the calling ``corral``
    function (``module:function:call``), or ``(outside corral)``; reads of modules
    starting with one of ``skip`` are not counted, nor those made under a module of
    ``host_side`` (values kept on the host whatever the device)."""
    counts: Counter[str] = Counter()
    saved_methods = {
        name: torch.Tensor.__dict__.get(name)
        for name in (*READS, *SIZED_BY_VALUES, "__getitem__", "__setitem__")
    }
    saved_functions = {name: getattr(torch, name) for name in (*SIZED_BY_VALUES, "where")}

    inside = [False]  # in a counted call: the calls it makes are its own (unique's)

    def count(name: str) -> None:
        who = None if inside[0] else _caller(skip, host_side)
        if who is not None:
            counts[f"{who}:{name}"] += 1

    def wrap(name: str, original):
        def read(*args, **kwargs):
            count(name)
            outer, inside[0] = inside[0], True
            try:
                return original(*args, **kwargs)
            finally:
                inside[0] = outer

        return read

    get, put = torch.Tensor.__getitem__, torch.Tensor.__setitem__

    def getitem(self, index):
        if _has_bool_index(index):
            count("[bool mask]")
        return get(self, index)

    def setitem(self, index, value):
        if _has_bool_index(index):
            count("[bool mask]=")
        return put(self, index, value)

    where = torch.where

    def one_argument_where(*args, **kwargs):
        if len(args) + len(kwargs) == 1:
            count("where(condition)")
        return where(*args, **kwargs)

    for name in (*READS, *SIZED_BY_VALUES):
        setattr(torch.Tensor, name, wrap(name, getattr(torch.Tensor, name)))
    for name in SIZED_BY_VALUES:
        setattr(torch, name, wrap(name, getattr(torch, name)))
    torch.Tensor.__getitem__, torch.Tensor.__setitem__ = getitem, setitem
    torch.where = one_argument_where
    try:
        yield counts
    finally:
        for name, value in saved_methods.items():
            if value is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, value)
        for name, value in saved_functions.items():
            setattr(torch, name, value)
