"""One op set over numpy and torch: the operations whose spellings differ between them.

Batched envs, the vector layer and the rollouts compute on arrays of either
namespace: what both spell alike (``+``, ``&``, ``~``, indexing, ``.sum``) they
write as it is, what differs they call here. :class:`Ops` computes in numpy,
:class:`TorchOps` (same methods, same results, bit for bit where the two
libraries round alike) in torch on a device, reading nothing back to the host.
:func:`ops_for` gives the op set of where a :class:`~corral.arrays.Place`
computes, :func:`ops_in` that of its own arrays, :func:`ops_of` that of an array.

The row writes (:meth:`Ops.write_rows`, :meth:`Ops.fill_rows`, :meth:`Ops.copy_rows`)
take the rows as ``None`` (all), or in numpy a bool mask or indices, in torch a bool
mask, blended in without reading it on the host.

Examples:
    >>> ops = ops_of(np.zeros(3))
    >>> dst = np.zeros((3, 2))
    >>> ops.write_rows(dst, np.ones((3, 2)), np.array([True, False, True]))
    >>> dst[:, 0].tolist()
    [1.0, 0.0, 1.0]
    >>> ops.take(np.arange(6).reshape(2, 3), np.array([2, 0]), 1).tolist()
    [[2, 0], [5, 3]]
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt

from corral.arrays.place import Array, Place, import_torch, is_tensor, torch_dtype

# Up to this many rows, numpy's reduction along the short axis beats one ``|=`` per column.
_FEW_ROWS = 32


class Ops:
    """The op set in numpy (see the module); :class:`TorchOps` has the same methods."""

    xp: Any = np
    """The namespace (``numpy``, or ``torch``)."""
    torch: Any = None
    """The torch module, for torch-only code (``None`` in numpy)."""

    sqrt: Callable[..., Array] = staticmethod(np.sqrt)
    exp: Callable[..., Array] = staticmethod(np.exp)
    where: Callable[..., Array] = staticmethod(np.where)
    cos: Callable[..., Array] = staticmethod(np.cos)
    sin: Callable[..., Array] = staticmethod(np.sin)
    arctan2: Callable[..., Array] = staticmethod(np.arctan2)
    subtract: Callable[..., Array] = staticmethod(np.subtract)  # takes ``out=``
    multiply: Callable[..., Array] = staticmethod(np.multiply)  # takes ``out=``

    def __init__(self) -> None:
        self._columns: dict[int, tuple[np.ndarray, list]] = {}

    # -- making arrays ----------------------------------------------------------------

    def zeros(
        self, shape: tuple[int, ...], like: Array, dtype: npt.DTypeLike | None = None
    ) -> Array:
        """Zeros of ``shape`` in ``like``'s namespace and device, with ``like``'s dtype unless
        ``dtype`` (a numpy dtype) is given."""
        return np.zeros(shape, np.asarray(like).dtype if dtype is None else dtype)

    def zeros_like(self, array: Array) -> Array:
        return np.zeros_like(array)

    def empty(self, shape: tuple[int, ...], dtype: npt.DTypeLike) -> Array:
        """An uninitialised array of ``shape`` and (numpy) ``dtype`` on the op set's device."""
        return np.empty(shape, dtype)

    def arange(self, stop: int, like: Array) -> Array:
        """``0, 1, ..., stop - 1`` (int64) on ``like``'s device."""
        return np.arange(stop, dtype=np.int64)

    def copy(self, array: Array) -> Array:
        """A new array equal to ``array``, of its kind and device."""
        return array.copy()

    def astype(self, array: Array, dtype: npt.DTypeLike) -> Array:
        """``array`` in (numpy) ``dtype`` (itself where it has it)."""
        return array.astype(dtype, copy=False)

    # -- shapes and indices -----------------------------------------------------------

    def concat(self, arrays: list[Array], axis: int, dtype: npt.DTypeLike | None = None) -> Array:
        """The arrays joined along ``axis`` (and cast to ``dtype`` if given: each value
        rounded once)."""
        return np.concatenate(arrays, axis, dtype=dtype)

    def stack(self, arrays: list[Array], axis: int) -> Array:
        return np.stack(arrays, axis)

    def broadcast_to(self, array: Array, shape: tuple[int, ...]) -> Array:
        """A read-only view of ``array`` broadcast to ``shape``."""
        return np.broadcast_to(array, shape)

    def flat(self, array: Array) -> Array:
        """``[E, *shape]`` as ``[E, prod(shape)]`` (a view)."""
        return array.reshape(len(array), -1)

    def take(self, array: Array, index: Array, axis: int) -> Array:
        """``array``'s entries at ``index`` (an int array of any shape) along ``axis``: shape
        ``array.shape[:axis] + index.shape + array.shape[axis + 1:]``."""
        return np.take(array, index, axis=axis)

    def gather(self, array: Array, index: Array, axis: int) -> Array:
        """``take_along_axis``: ``index`` has ``array``'s number of dimensions."""
        return np.take_along_axis(array, index, axis)

    def put(self, array: Array, index: Array, value: Array | float, axis: int) -> None:
        """``array``'s entries at ``index`` (1-d ints) along ``axis`` set to ``value``, in
        place."""
        array[(slice(None),) * (axis % array.ndim) + (index,)] = value

    def replaced(self, array: Array, index: Array, value: Array, axis: int) -> Array:
        """A new array: ``array`` with its entries at ``index`` (1-d ints) along ``axis``
        replaced by ``value``."""
        out = array.copy()
        out[(slice(None),) * (axis % array.ndim) + (index,)] = value
        return out

    def nonzero(self, array: Array) -> tuple[Array, ...]:
        """The indices of ``array``'s true entries, one array per dimension (in torch this
        reads the device: their number)."""
        return np.nonzero(array)

    def is_mask(self, rows: Array) -> bool:
        """Whether ``rows`` selects by a bool array (else: by indices)."""
        return rows.dtype == np.bool_

    def fits(self, array: Any, like: Array) -> bool:
        """Whether ``array`` can stand for ``like``: same shape and dtype (and device),
        C-contiguous."""
        return (
            isinstance(array, np.ndarray)
            and (array.shape, array.dtype) == (like.shape, like.dtype)
            and array.flags.c_contiguous
        )

    # -- elementwise and reductions ---------------------------------------------------

    def softplus(self, x: Array) -> Array:
        """``log(1 + exp(x))`` as mpe2 computes it (``logaddexp(0, x)``)."""
        return np.logaddexp(0, x)

    def amax(self, array: Array, axis: int) -> Array:
        return np.amax(array, axis)

    def amin(self, array: Array, axis: int) -> Array:
        return np.amin(array, axis)

    def argsort(self, array: Array, axis: int) -> Array:
        """Indices that sort ``array`` along ``axis``, ties in their order (stable)."""
        return np.argsort(array, axis, kind="stable")

    def count(self, flags: Array) -> Array:
        """How many of ``flags`` (``[Y, E]``) hold in each column, as float64."""
        return flags.sum(0, dtype=np.float64)

    def rows_any(self, flags: Array) -> Callable[[], Array]:
        """A function returning ``flags.any(1)`` of a bool array ``[E, n]`` (as a new array),
        the cheapest way for its kind and shape, chosen once."""
        n = flags.shape[1]
        if n in (1, 2, 4, 8) and flags.flags.c_contiguous:
            words = flags.view(f"u{n}")[:, 0]  # each row's n bytes as one integer
            return partial(np.not_equal, words, 0)
        if n > 8 or n == 0 or len(flags) <= _FEW_ROWS:
            return partial(flags.any, 1)
        return partial(_any_by_columns, self, flags)

    def copy_major_sum(self, a: Array, b: Array) -> Array:
        """``(a + b).T`` as a new C-contiguous array, for ``a``, ``b`` ``[n, K]`` (a few ``n``):
        one strided write per row (a transposing copy of a few values per item is slow)."""
        out = np.empty(a.shape[::-1], np.result_type(a, b))
        for j in range(len(a)):
            np.add(a[j], b[j], out=out[:, j])
        return out

    # -- row writes (rows: the first axis) --------------------------------------------

    def assign(self, out: Array, value: Array) -> None:
        """``out[...] = value``."""
        np.copyto(out, value)

    def copy_rows(self, dst: Array, src: Array, rows: Array | None) -> None:
        """``dst[rows] = src[rows]`` (all rows for ``None``; a bool mask or indices)."""
        if rows is None:
            dst[...] = src
        else:
            dst[rows] = src[rows]

    def write_rows(self, dst: Array, src: Array, rows: Array | None) -> None:
        """:meth:`copy_rows`, but nothing where ``src`` is ``dst`` (or a view of all of its
        memory)."""
        if src is dst or (
            isinstance(src, np.ndarray)
            and isinstance(dst, np.ndarray)
            and src.__array_interface__ == dst.__array_interface__
        ):
            return
        if rows is None:
            dst[...] = src
        else:
            dst[rows] = src[rows]

    def fill_rows(self, dst: Array, value: Any, rows: Array | None) -> None:
        """``dst[rows] = value`` (all rows for ``None``)."""
        if rows is None:
            dst[...] = value
        else:
            dst[rows] = value

    def as_rows(self, array: Array) -> Array:
        """A C-contiguous numpy array ``[E, ...]`` as ``[E]`` items, each a row's bytes (numpy
        copies the rows that an index selects an item each, not a value each: a few times
        faster); other arrays as they are."""
        if not isinstance(array, np.ndarray) or not array.flags.c_contiguous or not array.size:
            return array
        return array.reshape(len(array), -1).view(f"V{array[0].nbytes}")[:, 0]

    def write_transposed(self, out: Array, rows: Array, copies: Array | None) -> None:
        """``out[copies] = rows.T`` (all of ``out`` for ``None``): ``out`` ``[E, R]``, ``rows``
        ``[R, K]`` the values of the ``K`` copies selected by indices (of all ``E`` for a
        bool mask, blended in)."""
        if copies is not None:
            out[copies] = rows.T
        elif len(rows) <= 4:  # a transposing copy whose inner loop is a few values is slow
            for j, row in enumerate(rows):
                out[:, j] = row
        else:
            out[...] = rows.T

    def keep(self, values: Array, keep: Array, last: Array, bits: Array) -> None:
        """``values`` (each agent's rows, ``[n * S, E]``, 4-byte values) where ``keep``
        (``[n, E]``) holds, else ``last``, in place (``bits``: scratch like ``values``, as
        int32). Blended as bits, ``last ^ ((values ^ last) & -keep)``: no branch per value."""
        n, size = len(keep), len(values) // len(keep)
        new, old = values.view(np.int32), last.view(np.int32)
        np.bitwise_xor(new, old, out=bits)
        mask = np.negative(keep, dtype=np.int32)[:, None]  # all bits set where kept
        np.bitwise_and(bits.reshape(n, size, -1), mask, out=bits.reshape(n, size, -1))
        np.bitwise_xor(old, bits, out=new)

    def write_masks(self, out: Array, table: Array, key: Array, copies: Array | None) -> None:
        """``out[copies]`` (all for ``None``): the rows ``key`` (``[K, n]``, C-contiguous) of a
        mask table ``[*, n_actions]`` of bool, ``out`` being ``[E, n, n_actions]``."""
        if copies is not None:  # one item of n_actions bytes per mask
            item = f"V{table.shape[1]}"
            out.view(item)[copies, :, 0] = np.take(table.view(item)[:, 0], key)
            return
        # Each mask's bytes as a few unsigned integers (9: 8 + 1) read from tables of them,
        # written through strided views of out: numpy takes such items at C speed, where
        # it copies other sizes one call each.
        e, n, width = out.shape
        for offset, column in self._mask_columns(table):
            part = np.ndarray((e, n), column.dtype, out, offset, (n * width, width))
            np.take(column, key, out=part, mode="clip")

    def _mask_columns(self, table: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """``table``'s rows cut into unsigned integers of 8, 4, 2, 1 bytes: (offset, the
        column of them), kept for the table."""
        kept = self._columns.get(id(table))
        if kept is not None and kept[0] is table:
            return kept[1]
        columns, offset, width = [], 0, table.shape[1]
        for size in (8, 4, 2, 1):
            while width - offset >= size:
                part = np.ascontiguousarray(table[:, offset : offset + size])
                columns.append((offset, part.view(f"u{size}")[:, 0]))
                offset += size
        self._columns[id(table)] = (table, columns)
        return columns


class TorchOps(Ops):
    """:class:`Ops` in torch, on ``device``: every method of :class:`Ops` is spelled anew
    here (none falls through to numpy)."""

    def __init__(self, device: str = "cpu") -> None:
        self.torch = torch = import_torch()
        self.xp = torch
        self.device = torch.device(device)
        self.sqrt, self.exp, self.where = torch.sqrt, torch.exp, torch.where
        self.cos, self.sin, self.arctan2 = torch.cos, torch.sin, torch.atan2
        self.subtract, self.multiply = torch.sub, torch.mul
        common = (np.float32, np.float64, np.int64, np.int32, np.int16, np.uint8, np.bool_)
        self._dtypes: list[tuple[Any, Any]] = [(t, torch_dtype(t)) for t in common]
        self._dtypes.append((bool, torch.bool))
        self._dtypes += [(np.dtype(t), torch_dtype(t)) for t in common]

    def _dtype(self, dtype: npt.DTypeLike) -> Any:
        """The torch dtype of a numpy dtype (or a torch one): the common ones found by identity
        (which ``torch.compile`` traces without a graph break), others converted."""
        for known, found in self._dtypes:
            if dtype is known:
                return found
        return dtype if isinstance(dtype, self.torch.dtype) else torch_dtype(dtype)

    def zeros(
        self, shape: tuple[int, ...], like: Array, dtype: npt.DTypeLike | None = None
    ) -> Array:
        dtype = like.dtype if dtype is None else self._dtype(dtype)
        return self.torch.zeros(shape, dtype=dtype, device=like.device)

    def zeros_like(self, array: Array) -> Array:
        return self.torch.zeros_like(array)

    def empty(self, shape: tuple[int, ...], dtype: npt.DTypeLike) -> Array:
        return self.torch.empty(shape, dtype=self._dtype(dtype), device=self.device)

    def arange(self, stop: int, like: Array) -> Array:
        return self.torch.arange(stop, device=like.device)

    def copy(self, array: Array) -> Array:
        return array.clone()

    def astype(self, array: Array, dtype: npt.DTypeLike) -> Array:
        return array.to(self._dtype(dtype))

    def concat(self, arrays: list[Array], axis: int, dtype: npt.DTypeLike | None = None) -> Array:
        out = self.torch.cat(arrays, axis)
        return out if dtype is None else out.to(self._dtype(dtype))

    def stack(self, arrays: list[Array], axis: int) -> Array:
        return self.torch.stack(arrays, axis)

    def broadcast_to(self, array: Array, shape: tuple[int, ...]) -> Array:
        return array.expand(shape)

    def flat(self, array: Array) -> Array:
        return array.view(len(array), -1)

    def take(self, array: Array, index: Array, axis: int) -> Array:
        if index.dim() == 1:
            return array.index_select(axis, index)
        axis %= array.dim()
        flat = array.index_select(axis, index.reshape(-1))
        return flat.view(*array.shape[:axis], *index.shape, *array.shape[axis + 1 :])

    def gather(self, array: Array, index: Array, axis: int) -> Array:
        return self.torch.gather(array, axis, index)

    def put(self, array: Array, index: Array, value: Array | float, axis: int) -> None:
        if isinstance(value, (bool, int, float)):
            array.index_fill_(axis, index, value)
        else:
            array.index_copy_(axis, index, value)

    def replaced(self, array: Array, index: Array, value: Array, axis: int) -> Array:
        return array.index_copy(axis, index, value)

    def nonzero(self, array: Array) -> tuple[Array, ...]:
        return array.nonzero(as_tuple=True)

    def is_mask(self, rows: Array) -> bool:
        return rows.dtype == self.torch.bool

    def fits(self, array: Any, like: Array) -> bool:
        return (
            isinstance(array, self.torch.Tensor)
            and (array.shape, array.dtype, array.device) == (like.shape, like.dtype, like.device)
            and array.is_contiguous()
        )

    def softplus(self, x: Array) -> Array:
        return self.torch.logaddexp(self.torch.zeros_like(x), x)

    def amax(self, array: Array, axis: int) -> Array:
        return self.torch.amax(array, axis)

    def amin(self, array: Array, axis: int) -> Array:
        return self.torch.amin(array, axis)

    def argsort(self, array: Array, axis: int) -> Array:
        return self.torch.argsort(array, dim=axis, stable=True)

    def count(self, flags: Array) -> Array:
        return flags.sum(0, dtype=self.torch.float64)

    def rows_any(self, flags: Array) -> Callable[[], Array]:
        n = flags.shape[1]
        if n > 8 or n == 0:
            return partial(flags.any, 1)
        return partial(_any_by_columns, self, flags)

    def copy_major_sum(self, a: Array, b: Array) -> Array:
        return (a + b).T.contiguous()

    def assign(self, out: Array, value: Array) -> None:
        out.copy_(value)

    def copy_rows(self, dst: Array, src: Array, rows: Array | None) -> None:
        if rows is None:
            dst[...] = src
        else:  # indexing by the mask would read it on the host
            dst.copy_(src.where(rows.reshape(-1, *([1] * (dst.ndim - 1))), dst))

    def write_rows(self, dst: Array, src: Array, rows: Array | None) -> None:
        if src is not dst:
            self.copy_rows(dst, src, rows)

    def fill_rows(self, dst: Array, value: Any, rows: Array | None) -> None:
        if rows is None:
            dst[...] = value
        else:  # indexing by the mask would read it on the host
            dst.masked_fill_(rows.reshape(-1, *([1] * (dst.ndim - 1))), value)

    def as_rows(self, array: Array) -> Array:
        return array

    def write_transposed(self, out: Array, rows: Array, copies: Array | None) -> None:
        if copies is not None and copies.dtype == self.torch.bool:
            out.copy_(self.torch.where(copies[:, None], rows.T, out))
        elif copies is not None:
            out.index_copy_(0, copies, rows.T)
        elif len(rows) <= 4:
            for j, row in enumerate(rows):
                out[:, j].copy_(row)
        else:
            out.copy_(rows.T)

    def keep(self, values: Array, keep: Array, last: Array, bits: Array) -> None:
        torch = self.torch
        n, size = len(keep), len(values) // len(keep)
        new, old = values.view(torch.int32), last.view(torch.int32)
        torch.bitwise_xor(new, old, out=bits)
        mask = keep.to(torch.int32).neg_()[:, None]
        bits.view(n, size, -1).bitwise_and_(mask)
        torch.bitwise_xor(old, bits, out=new)

    def write_masks(self, out: Array, table: Array, key: Array, copies: Array | None) -> None:
        masks = self.take(table, key, 0)
        if copies is None:
            out.copy_(masks)
        elif copies.dtype == self.torch.bool:
            out.copy_(self.torch.where(copies[:, None, None], masks, out))
        else:
            out.index_copy_(0, copies, masks)


def _any_by_columns(ops: Ops, flags: Array) -> Array:
    """``flags.any(1)`` as one ``|=`` per column (a reduction along a short axis is slow in
    numpy)."""
    out = ops.copy(flags[:, 0])
    for j in range(1, flags.shape[1]):
        out |= flags[:, j]
    return out


_NUMPY = Ops()
_TORCH: dict[Any, TorchOps] = {}  # by torch device


def ops_for(place: Place) -> Ops:
    """The op set of where ``place`` computes in the vector layer: numpy where
    :attr:`~corral.arrays.Place.computes_on_host` (numpy, or torch on the CPU through numpy
    views of its tensors), else torch on its device."""
    return Ops() if place.computes_on_host else TorchOps(place.device)


def ops_in(place: Place) -> Ops:
    """The op set of ``place``'s own arrays: torch for any torch place (on the CPU too)."""
    return TorchOps(place.device) if place.is_torch else Ops()


def ops_of(array: Any) -> Ops:
    """The op set of ``array``'s namespace and device (shared: one per device)."""
    if not type(array).__module__.startswith("torch"):  # is_tensor, without a call
        return _NUMPY
    try:
        return _TORCH[array.device]
    except KeyError:
        ops = _TORCH[array.device] = TorchOps(str(array.device))
        return ops


def xp(array: Any) -> Any:
    """The namespace of ``array``: the ``torch`` module for a tensor, else ``numpy``."""
    return import_torch() if is_tensor(array) else np


def zeros(like: Any, shape: tuple[int, ...], dtype: npt.DTypeLike | None = None) -> Any:
    """Zeros of ``shape`` in ``like``'s namespace and device, with ``like``'s dtype unless
    ``dtype`` (a numpy dtype) is given."""
    return ops_of(like).zeros(shape, like, dtype)
