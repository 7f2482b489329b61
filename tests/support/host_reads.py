"""Counting host reads of torch tensors on the CPU: the calls that synchronise a GPU.

On a GPU, a call that needs a tensor's values on the host (``.item()``,
``bool()``, ``.tolist()``, ``.cpu()``...), or that needs them to know the shape
of its result (``nonzero``, ``argwhere``, ``masked_select``, ``unique``,
one-argument ``torch.where``, indexing by a bool tensor), waits for the device.
:func:`counting_reads` counts such calls on any device, so that a CPU-only
machine checks what ``torch.cuda.set_sync_debug_mode("error")`` checks on a GPU.

The other direction, :func:`counting_transfers`: on a GPU, a tensor made of host
memory (numpy arrays, lists, Python numbers) is copied to the device by a
``cudaMemcpy`` that synchronises (unless it is asynchronous, from pinned memory).
On the CPU every tensor is host memory, so the counter tells host data from
device data by where it came from:

- host data is a numpy array, a list or tuple (of numbers or arrays), or a Python
  number given as the data of ``torch.tensor``/``as_tensor``/``asarray``/
  ``Tensor.new_tensor``; and a *host tensor*: one made, while counting, by
  ``torch.from_numpy``, by those calls without a ``device``, by a factory
  (``torch.zeros``, ``arange``, ``rand``...) without a ``device``, or computed from
  host tensors alone (host work, as a draw from a CPU generator);
- every other tensor is device data: made on the place's device, computed from
  device data, or made before counting began (build the objects first: the
  constants of a constructor are copied once);
- a transfer is a tensor made of host data with a ``device`` given (or by
  ``new_tensor``, on its tensor's device), or a call where host data meets device
  data: ``x.to(device)``/``.cuda()`` or ``torch.as_tensor(x, device=)`` of a host
  tensor, an operation mixing a host tensor (not a 0-d one: a CPU scalar is a
  kernel's argument on a GPU) with device tensors (``torch.where(mask, x,
  host_tensor)``, ``x + host_tensor``, ``x.copy_(host_tensor)``), indexing a device
  tensor with a list, a numpy array or a host tensor (``x[[0, 2]]``,
  ``x[np_index] = ...``), writing a host tensor into one, any torch call given a
  numpy array. Python and numpy numbers as operands (``x * 2.0``,
  ``torch.full(shape, 0.5, device=)``) are kernel arguments, not copies.
- a copy with ``non_blocking=True`` is asynchronous (from pinned memory on a GPU, as
  ``corral.algos.networks.to_device`` makes it): not counted.
"""

from __future__ import annotations

import contextlib
import sys
from collections import Counter
from collections.abc import Iterator

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

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

HELPERS = ("corral.arrays.place",)
"""Modules whose reads are their caller's (``to_numpy`` reads for whoever calls it)."""


def _has_bool_index(index: object) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


def _caller(skip: tuple[str, ...], host_side: tuple[str, ...]) -> str | None:
    """The innermost ``corral`` function on the stack (:data:`HELPERS` aside), as
    ``module:function``; ``None`` where it is one of ``skip`` or a ``host_side`` module
    comes first (its reads are not counted)."""
    return _caller_of(sys._getframe(2), skip, host_side)


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


# -- host-to-device transfers ----------------------------------------------------------

FROM_HOST_DATA = ("tensor", "as_tensor", "asarray", "new_tensor")
"""Calls that make a tensor of their data argument: a copy where it is host data."""

FACTORIES = (
    "zeros",
    "ones",
    "empty",
    "full",
    "arange",
    "linspace",
    "eye",
    "rand",
    "randn",
    "randint",
    "randperm",
)
"""``torch`` functions allocating a tensor: on the host where no ``device`` is given."""

INDEXING = ("__getitem__", "__setitem__")
"""Tensor methods taking an index: a list or a numpy array there is host data."""

METADATA = (
    "__get__",
    "__len__",
    "size",
    "dim",
    "numel",
    "stride",
    "is_floating_point",
    "is_contiguous",
    "element_size",
    "data_ptr",
    "__repr__",
    "__format__",
    *READS,
)
"""Tensor calls that read no values on the device (or, :data:`READS`, read them back)."""

_HOST = "_host_reads_host_tensor"  # a tensor attribute: its memory is host data


def _is_host_tensor(value: object) -> bool:
    return isinstance(value, torch.Tensor) and getattr(value, _HOST, False)


def _tensors(values: object) -> list[torch.Tensor]:
    """The tensors in ``values`` (nested in tuples, lists and dicts)."""
    found: list[torch.Tensor] = []

    def walk(value: object) -> None:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (tuple, list)):
            for v in value:
                walk(v)
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)

    walk(values)
    return found


def _has_numpy(values: object) -> bool:
    """Whether ``values`` holds a numpy array (a numpy scalar is a Python number to torch)."""
    if isinstance(values, np.ndarray):
        return True
    if isinstance(values, (tuple, list)):
        return any(_has_numpy(v) for v in values)
    if isinstance(values, dict):
        return any(_has_numpy(v) for v in values.values())
    return False


def _index_is_host(index: object) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, (list, np.ndarray)) or _is_host_tensor(i) for i in items)


def _tag(value: object, host: bool = True) -> None:
    for tensor in _tensors(value):
        setattr(tensor, _HOST, host)


def _moves(args: tuple, kwargs: dict) -> bool:
    """Whether ``Tensor.to``'s arguments name a device (not only a dtype)."""
    targets = (*args[1:], kwargs.get("device"), kwargs.get("other"))
    return any(isinstance(a, (str, torch.device, torch.Tensor)) for a in targets)


class _Transfers(TorchFunctionMode):
    def __init__(self, counts: Counter[str], skip, host_side) -> None:
        super().__init__()
        self.counts, self.skip, self.host_side = counts, skip, host_side

    def count(self, what: str) -> None:
        who = _caller_of(sys._getframe(2), self.skip, self.host_side)
        if who is not None:
            self.counts[f"{who}:{what}"] += 1

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        result = func(*args, **kwargs)
        if name in METADATA:
            return result
        if name in FROM_HOST_DATA:
            data = args[1] if name == "new_tensor" else (args[0] if args else kwargs.get("data"))
            host = not isinstance(data, torch.Tensor) or _is_host_tensor(data)
            if name == "new_tensor":
                onto_device = not _is_host_tensor(args[0]) or kwargs.get("device") is not None
            else:
                onto_device = kwargs.get("device") is not None
            if host and onto_device:
                self.count(f"{name}(host data)")
            _tag(result, host and not onto_device)
            return result
        if name in FACTORIES and func is getattr(torch, name, None):
            _tag(result, kwargs.get("device") is None)
            return result
        if name in ("to", "cuda") and args and _is_host_tensor(args[0]):
            moves = name == "cuda" or _moves(args, kwargs)
            if moves and not kwargs.get("non_blocking", False):
                self.count(f"{name}(host tensor)")
            _tag(result, not moves)  # moved: device data (asynchronously with non_blocking)
            return result
        if f"__{name.strip('_')}__" in INDEXING and args and not _is_host_tensor(args[0]):
            if _index_is_host(args[1]):
                self.count(f"{name}(host index)")
            elif "setitem" in name and any(_is_host_tensor(t) for t in _tensors(args[2:])):
                self.count(f"{name}(host value)")
            return result
        tensors = _tensors((args, kwargs))
        host = [t for t in tensors if _is_host_tensor(t)]
        if _has_numpy((args, kwargs)):
            self.count(f"{name}(numpy)")
        elif len(host) < len(tensors) and any(t.dim() > 0 for t in host):
            # host data meets device data (a host scalar is a kernel's argument)
            if not (name == "copy_" and kwargs.get("non_blocking", False)):
                self.count(f"{name}(host tensor)")
        elif host:
            _tag(result)  # computed on the host
        return result


def _caller_of(frame, skip: tuple[str, ...], host_side: tuple[str, ...]) -> str | None:
    """The innermost ``corral`` function from ``frame`` outwards (see :func:`_caller`)."""
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
def counting_transfers(
    skip: tuple[str, ...] = (), host_side: tuple[str, ...] = ()
) -> Iterator[Counter[str]]:
    """Count host-to-device transfers (see the module's docstring) by the calling ``corral``
    function, as :func:`counting_reads` counts reads."""
    counts: Counter[str] = Counter()
    from_numpy = torch.from_numpy

    def tagged_from_numpy(array):
        result = from_numpy(array)
        _tag(result)
        return result

    torch.from_numpy = tagged_from_numpy
    try:
        with _Transfers(counts, skip, host_side):
            yield counts
    finally:
        torch.from_numpy = from_numpy
