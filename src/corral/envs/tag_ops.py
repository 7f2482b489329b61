"""The array operations of :class:`~corral.envs.tag_batched.BatchedTag` whose numpy and torch
spellings differ: :class:`NumpyOps` and :class:`TorchOps` take the same arguments."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from corral.arrays import import_torch, torch_dtype


class NumpyOps:
    """The operations whose numpy and torch spellings differ; arrays are agent-major."""

    concatenate: Callable[..., Any]
    where: Callable[..., Any]
    subtract: Callable[..., Any]
    multiply: Callable[..., Any]

    def __init__(self) -> None:
        self._columns: dict[int, tuple[np.ndarray, list]] = {}
        self.concatenate, self.where = np.concatenate, np.where
        self.subtract, self.multiply = np.subtract, np.multiply

    def empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        return np.empty(shape, dtype)

    def int64(self, array: np.ndarray) -> np.ndarray:
        return array.astype(np.int64, copy=False)

    def is_mask(self, copies: np.ndarray) -> bool:
        """Whether ``copies`` selects copies by a bool array ``[E]`` (else: indices)."""
        return copies.dtype == np.bool_

    def int16(self, array: np.ndarray) -> np.ndarray:
        return array.astype(np.int16)

    def copy(self, array: np.ndarray) -> np.ndarray:
        return array.copy()

    def broadcast(self, row: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return np.broadcast_to(row, shape)

    def take(self, table: np.ndarray, index: np.ndarray) -> np.ndarray:
        """``table``'s entries (rows) at ``index``: ``[*index.shape, *table.shape[1:]]``."""
        return np.take(table, index, axis=0)

    def columns(self, array: np.ndarray, columns: np.ndarray) -> np.ndarray:
        """``array[..., columns]``: the entries of some copies."""
        return array[..., columns]

    def put_columns(self, array: np.ndarray, columns: np.ndarray, value: Any) -> None:
        """``array[..., columns] = value``."""
        array[..., columns] = value

    def fits(self, array: Any, like: np.ndarray) -> bool:
        """Whether ``array`` can stand for ``like``: same shape and dtype, C-contiguous."""
        return (
            isinstance(array, np.ndarray)
            and (array.shape, array.dtype) == (like.shape, like.dtype)
            and array.flags.c_contiguous
        )

    def flat(self, array: np.ndarray) -> np.ndarray:
        """``[E, *shape]`` as ``[E, prod(shape)]`` (a view)."""
        return array.reshape(len(array), -1)

    def assign(self, out: np.ndarray, value: np.ndarray) -> None:
        """``out[...] = value``."""
        np.copyto(out, value)

    def put_rows(self, out: np.ndarray, rows: np.ndarray, copies: np.ndarray | None) -> None:
        """``out[copies] = rows.T`` (all of ``out`` for ``None``): ``out`` ``[E, R]``."""
        if copies is not None:
            out[copies] = rows.T
        elif len(rows) <= 4:  # a transposing copy whose inner loop is a few values is slow
            for j, row in enumerate(rows):
                out[:, j] = row
        else:
            out[...] = rows.T

    def keep(self, values: np.ndarray, keep: np.ndarray, last: np.ndarray, bits: np.ndarray):
        """``values`` (each agent's rows, ``[n * S, E]``) where ``keep`` (``[n, E]``)
        holds, else ``last``, in place (``bits``: scratch like ``values``, as int32).
        Blended as bits, ``last ^ ((values ^ last) & -keep)``: no branch per value."""
        n, size = len(keep), len(values) // len(keep)
        new, old = values.view(np.int32), last.view(np.int32)
        np.bitwise_xor(new, old, out=bits)
        mask = np.negative(keep, dtype=np.int32)[:, None]  # all bits set where kept
        np.bitwise_and(bits.reshape(n, size, -1), mask, out=bits.reshape(n, size, -1))
        np.bitwise_xor(old, bits, out=new)

    def count(self, flags: np.ndarray) -> np.ndarray:
        """How many of ``flags`` (``[Y, E]``) hold in each copy, as float64."""
        return flags.sum(0, dtype=np.float64)

    def copy_major_sum(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """``(a + b).T`` as a new C-contiguous array, for ``a``, ``b`` ``[n, K]`` (a few ``n``):
        one strided write per row (a transposing copy of a few values per item is slow)."""
        out = np.empty(a.shape[::-1], np.result_type(a, b))
        for j in range(len(a)):
            np.add(a[j], b[j], out=out[:, j])
        return out

    def put_masks(
        self, out: np.ndarray, table: np.ndarray, key: np.ndarray, copies: np.ndarray | None
    ) -> None:
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


class TorchOps:
    """:class:`NumpyOps` in torch, on ``device``."""

    def __init__(self, device: str) -> None:
        self.torch = torch = import_torch()
        self.device = torch.device(device)
        self.concatenate, self.where = torch.cat, torch.where
        self.subtract, self.multiply = torch.sub, torch.mul

    def empty(self, shape: tuple[int, ...], dtype: Any) -> Any:
        return self.torch.empty(shape, dtype=torch_dtype(dtype), device=self.device)

    def int64(self, array: Any) -> Any:
        return array.long()

    def is_mask(self, copies: Any) -> bool:
        return copies.dtype == self.torch.bool

    def int16(self, array: Any) -> Any:
        return array.short()

    def copy(self, array: Any) -> Any:
        return array.clone()

    def broadcast(self, row: Any, shape: tuple[int, ...]) -> Any:
        return row.expand(shape)

    def take(self, table: Any, index: Any) -> Any:
        flat = self.torch.index_select(table, 0, index.reshape(-1))
        return flat.view(*index.shape, *table.shape[1:])

    def columns(self, array: Any, columns: Any) -> Any:
        return self.torch.index_select(array, array.dim() - 1, columns)

    def put_columns(self, array: Any, columns: Any, value: Any) -> None:
        if isinstance(value, (bool, int, float)):
            array.index_fill_(array.dim() - 1, columns, value)
        else:
            array.index_copy_(array.dim() - 1, columns, value)

    def fits(self, array: Any, like: Any) -> bool:
        return (
            isinstance(array, self.torch.Tensor)
            and (array.shape, array.dtype, array.device) == (like.shape, like.dtype, like.device)
            and array.is_contiguous()
        )

    def flat(self, array: Any) -> Any:
        return array.view(len(array), -1)

    def assign(self, out: Any, value: Any) -> None:
        out.copy_(value)

    def put_rows(self, out: Any, rows: Any, copies: Any | None) -> None:
        if copies is not None and copies.dtype == self.torch.bool:
            out.copy_(self.torch.where(copies[:, None], rows.T, out))
        elif copies is not None:
            out.index_copy_(0, copies, rows.T)
        elif len(rows) <= 4:
            for j, row in enumerate(rows):
                out[:, j].copy_(row)
        else:
            out.copy_(rows.T)

    def keep(self, values: Any, keep: Any, last: Any, bits: Any) -> None:
        torch = self.torch
        n, size = len(keep), len(values) // len(keep)
        new, old = values.view(torch.int32), last.view(torch.int32)
        torch.bitwise_xor(new, old, out=bits)
        mask = keep.to(torch.int32).neg_()[:, None]
        bits.view(n, size, -1).bitwise_and_(mask)
        torch.bitwise_xor(old, bits, out=new)

    def count(self, flags: Any) -> Any:
        return flags.sum(0, dtype=self.torch.float64)

    def copy_major_sum(self, a: Any, b: Any) -> Any:
        return (a + b).T.contiguous()

    def put_masks(self, out: Any, table: Any, key: Any, copies: Any | None) -> None:
        masks = self.take(table, key)
        if copies is None:
            out.copy_(masks)
        elif copies.dtype == self.torch.bool:
            out.copy_(self.torch.where(copies[:, None, None], masks, out))
        else:
            out.index_copy_(0, copies, masks)
