"""Per-copy random streams as arrays: numpy's ``Generator(PCG64)`` for every copy at once.

A natively batched env draws, for each of its ``E`` copies, exactly what a dict
env seeded ``seed + i`` draws from its ``np_random`` (``Generator(PCG64)``), in
one array operation over all copies, in numpy or in torch on any device.

Each stream is PCG64's state as int64 arrays: the 128-bit LCG state and
increment as high and low 64-bit halves, and the upper half of a 64-bit draw
that ``next_uint32`` keeps for the next 32-bit draw. int64 arithmetic wraps
in both namespaces (torch's uint64 lacks addition and shifts), so each array
holds the bits of an unsigned 64-bit word, and the helpers below do the
unsigned operations (logical shifts, carries, comparisons) on them.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import TypedDict

import numpy as np

from corral.arrays.place import Array, Place, import_torch, to_numpy

MULTIPLIER = 0x2360ED051FC65DA44385DF649FCCF645  # PCG64's 128-bit LCG multiplier
_MASK32, _MASK64, _MASK128 = (1 << 32) - 1, (1 << 64) - 1, (1 << 128) - 1
_MIN64 = -(1 << 63)
_MUL_HI, _MUL_LO = MULTIPLIER >> 64, MULTIPLIER & _MASK64
_NEGLIGIBLE = 2.0**-64  # on a device, the chance of a rejection past the drawn rounds


class CopyStreams:
    """One PCG64 stream per copy, as arrays of a :class:`~corral.arrays.Place` (numpy, or
    torch on any device): copy ``i`` draws what its own ``numpy.random.Generator`` draws.

    :meth:`seed` seeds copies as ``np.random.default_rng(seed)`` does (the dict env's
    ``np_random``); :meth:`uniform` and :meth:`integers` draw what
    ``Generator.uniform(low, high, size)`` and ``Generator.integers(low, high)`` draw,
    one row per copy, and advance the streams of the copies ``where`` selects (a bool
    array ``[E]`` of the place, all copies for ``None``) without reading it on the host.
    :meth:`peek_words` reads ahead the 32-bit words that ``next_uint32`` would give and
    :meth:`skip_words` draws a number of them per copy (for a draw that consumes as many
    words as it needs, computed from the words read ahead).
    :meth:`generator` and :meth:`set_generator` move a copy's stream to and from a numpy
    ``Generator``; :meth:`copy_from` copies other streams. Draws of copies that were never
    seeded are unspecified.

    ``integers`` rejects a draw with a chance below ``n / 2**32`` (``n`` the number of
    values; ``n / 2**64`` past ``2**32`` values) and draws again. On the host every
    rejected copy draws again; on a device, where finding out would wait for it, every
    copy draws as many times as makes the chance that some copy needs more below
    ``2**-64``, so that (a few times more work there) no draw differs from numpy's in
    practice.

    Examples:
        >>> streams = CopyStreams(3, Place())
        >>> streams.seed([7, 8, 9])
        >>> copy_1 = np.random.default_rng(8)  # the generator copy 1 stands for
        >>> bool((streams.uniform(-1.0, 1.0, 2)[1] == copy_1.uniform(-1.0, 1.0, 2)).all())
        True
        >>> int(streams.integers(10)[1]) == int(copy_1.integers(10))
        True
    """

    def __init__(self, num_envs: int, place: Place) -> None:
        self.num_envs, self.place = num_envs, place
        words = [place.zeros((num_envs,), np.int64) for _ in range(5)]
        self._hi, self._lo, self._inc_hi, self._inc_lo, self._buffer = words
        self._buffered = place.zeros((num_envs,), np.bool_)
        self._seeded = np.zeros(num_envs, np.bool_)  # on the host: which copies have a stream
        self._jump_tables: dict[int, tuple[Array, ...]] = {}
        self._peeked: tuple = ()
        if place.is_torch:
            torch = import_torch()
            self._select = torch.where
            self._on_host = place.computes_on_host  # else as on a GPU: no read
        else:
            self._select, self._on_host = np.where, True

    def seed(self, seeds: Sequence[int | None], where: np.ndarray | None = None) -> None:
        """Reseed the copies ``where`` selects (a host bool array ``[E]``, all for ``None``)
        with their entry of ``seeds`` (one per copy), as ``np.random.default_rng`` does;
        those whose seed is ``None`` keep their stream, or draw a fresh one from the OS's
        entropy if they have none yet."""
        if len(seeds) != self.num_envs:
            raise ValueError(f"got {len(seeds)} seeds for {self.num_envs} copies")
        chosen = np.ones(self.num_envs, np.bool_) if where is None else to_numpy(where)
        if chosen.shape != (self.num_envs,):
            raise ValueError(f"where has shape {chosen.shape}, expected ({self.num_envs},)")
        copies = [
            i
            for i in np.flatnonzero(chosen).tolist()
            if seeds[i] is not None or not self._seeded[i]
        ]
        if not copies:
            return
        words = np.array([_words(_pcg64_state(seeds[i], i)) for i in copies], np.uint64)
        index = self.place.from_host(np.array(copies, np.int64))
        columns = [self.place.from_host(np.ascontiguousarray(w)) for w in words.view(np.int64).T]
        for array, column in zip(
            (self._hi, self._lo, self._inc_hi, self._inc_lo), columns, strict=True
        ):
            array[index] = column
        self._buffered[index] = False
        self._buffer[index] = 0
        self._seeded[copies] = True

    def uniform(self, low: float, high: float, size: int, where: Array | None = None) -> Array:
        """``[E, size]`` float64: row ``i`` is what copy ``i``'s
        ``Generator.uniform(low, high, size)`` returns (rows of unselected copies are
        unspecified)."""
        low, span = float(low), float(high) - float(low)  # numpy computes the span in doubles
        if not math.isfinite(span):
            raise OverflowError(f"uniform({low}, {high}): high - low is not a finite float")
        if math.copysign(1.0, span) < 0:
            raise ValueError(f"uniform({low}, {high}): high must not be below low")
        where = None if where is None else self.place.asarray(where, np.bool_)
        bits = self.place.zeros((self.num_envs, size), np.int64)
        hi, lo = self._hi, self._lo
        for k in range(size):
            hi, lo = _step(hi, lo, self._inc_hi, self._inc_lo)
            bits[:, k] = _output(hi, lo)
        self._advance(where, hi, lo)
        # numpy's next_double: the top 53 bits of a 64-bit draw, in [0, 1).
        unit = self.place.asarray(_shr(bits, 11), np.float64) * 2.0**-53
        return low + span * unit

    def integers(self, low: int, high: int | None = None, where: Array | None = None) -> Array:
        """``[E]`` int64: what each copy's ``Generator.integers(low, high)`` returns, a value
        in ``[low, high)`` (``[0, low)`` when ``high`` is ``None``; values of unselected
        copies are unspecified)."""
        low, high = (0, low) if high is None else (low, high)
        low, high = operator.index(low), operator.index(high)
        if high <= low:
            raise ValueError(f"integers({low}, {high}): low must be below high")
        if low < _MIN64 or high > -_MIN64:
            raise ValueError(f"integers({low}, {high}): the bounds must lie in int64")
        none = self.place.zeros((self.num_envs,), np.bool_)
        chosen = ~none if where is None else self.place.asarray(where, np.bool_)
        span = high - low - 1  # numpy's inclusive range
        if span == 0:
            value = self.place.zeros((self.num_envs,), np.int64)
        elif span == _MASK32:
            value = self._next32(chosen)
        elif span == _MASK64:
            value = self._next64(chosen)
        else:
            value = self._bounded(span + 1, 32 if span < _MASK32 else 64, chosen)
        return value + low  # wraps to the value in [low, high)

    def peek_words(self, count: int) -> Array:
        """``[E, count]`` int64: the next ``count`` 32-bit words of each copy's stream, those
        that ``count`` calls of its ``next_uint32`` would give (a word kept from the last
        64-bit draw first), without drawing them: :meth:`skip_words` does. All of them are
        computed at once from the copy's state (its LCG jumped ahead by each step)."""
        steps = (count + 1) // 2  # 64-bit draws: enough, with or without a word kept
        jump_hi, jump_lo, add_hi, add_lo = self._jumps(steps)
        x = (self._hi[:, None], self._lo[:, None])
        state = _add128(_mul128(x, (jump_hi, jump_lo)), _mul128(
            (self._inc_hi[:, None], self._inc_lo[:, None]), (add_hi, add_lo)
        ))  # fmt: skip
        out = _output(*state)
        self._peeked = (*state, out)
        halves = self._stack([out & _MASK32, _shr(out, 32)])  # [E, steps, 2]: low half first
        fresh = halves.reshape(self.num_envs, 2 * steps)
        kept = self._concat([self._buffer[:, None], fresh])
        return self._select(self._buffered[:, None], kept[:, :count], fresh[:, :count])

    def skip_words(self, used: Array, where: Array | None = None) -> None:
        """Draw ``used`` (``[E]`` int64 of the place, each at most the ``count`` of the last
        :meth:`peek_words`, with no draw since) of the words read ahead, in the copies
        ``where`` selects (all for ``None``): their streams are then where ``used`` calls
        of ``next_uint32`` leave numpy's."""
        hi, lo, out = self._peeked
        kept = self._buffered
        fresh = used - kept * 1  # words of new 64-bit draws (-1: the kept word was not used)
        steps = (fresh + 1) // 2
        drew = steps > 0
        at = (steps - 1) * drew  # the last 64-bit draw made
        last = [self._take(a, at) for a in (hi, lo, out)]
        chosen = drew if where is None else drew & where
        self._hi = self._select(chosen, last[0], self._hi)
        self._lo = self._select(chosen, last[1], self._lo)
        # A 64-bit draw keeps its upper half, which an even number of words then used.
        buffered = self._select(drew, (fresh & 1) == 1, (fresh < 0) & kept)
        if where is not None:
            buffered = self._select(where, buffered, kept)
        self._buffered = buffered
        self._buffer = self._select(chosen, _shr(last[2], 32), self._buffer)

    def _jumps(self, steps: int) -> tuple[Array, ...]:
        """``[1, steps]`` each: the 128-bit factors that jump a state ``k`` steps ahead,
        ``state * MULTIPLIER**k + inc * (MULTIPLIER**(k-1) + ... + 1)``, as 64-bit halves,
        for ``k`` = 1..``steps`` (kept by ``steps``)."""
        kept = self._jump_tables.get(steps)
        if kept is None:
            jump, add, rows = 1, 0, []
            for _ in range(steps):
                add = (add * MULTIPLIER + 1) & _MASK128
                jump = (jump * MULTIPLIER) & _MASK128
                rows.append((jump >> 64, jump & _MASK64, add >> 64, add & _MASK64))
            words = np.array(rows, np.uint64).view(np.int64).T
            kept = tuple(self.place.from_host(np.ascontiguousarray(w)[None]) for w in words)
            self._jump_tables[steps] = kept
        return kept

    def _stack(self, arrays: list[Array]) -> Array:
        if self.place.is_torch:
            return import_torch().stack(arrays, -1)
        return np.stack(arrays, -1)

    def _concat(self, arrays: list[Array]) -> Array:
        if self.place.is_torch:
            return import_torch().cat(arrays, 1)
        return np.concatenate(arrays, 1)

    def _take(self, array: Array, at: Array) -> Array:
        """``array[i, at[i]]`` for every copy ``i``."""
        if self.place.is_torch:
            return array.gather(1, at[:, None])[:, 0]
        return np.take_along_axis(array, at[:, None], 1)[:, 0]

    def generator(self, i: int) -> np.random.Generator:
        """A numpy ``Generator`` in copy ``i``'s current state (the copy keeps its own)."""
        if not self._seeded[i]:
            raise ValueError(f"copy {i} has no random stream yet: seed it first")
        hi, lo, inc_hi, inc_lo, buffer = (
            int(a[i]) & _MASK64
            for a in (self._hi, self._lo, self._inc_hi, self._inc_lo, self._buffer)
        )
        bit_generator = np.random.PCG64(0)
        bit_generator.state = {
            "bit_generator": "PCG64",
            "state": {"state": hi << 64 | lo, "inc": inc_hi << 64 | inc_lo},
            "has_uint32": int(bool(self._buffered[i])),
            "uinteger": buffer,
        }
        return np.random.Generator(bit_generator)

    def set_generator(self, i: int, generator: np.random.Generator) -> None:
        """Copy ``i`` takes ``generator``'s state (a ``Generator`` of ``PCG64``)."""
        if not isinstance(getattr(generator, "bit_generator", None), np.random.PCG64):
            raise TypeError(f"copy {i}: expected a numpy Generator of PCG64, got {generator!r}")
        state = generator.bit_generator.state
        for array, word in zip(
            (self._hi, self._lo, self._inc_hi, self._inc_lo, self._buffer),
            (*_words(state["state"]), state["uinteger"]),
            strict=True,
        ):
            array[i] = _signed(word)
        self._buffered[i] = bool(state["has_uint32"])
        self._seeded[i] = True

    def copy_from(self, other: CopyStreams, where: Array | None = None) -> None:
        """The copies ``where`` selects (a bool array ``[E]`` of the place, all for ``None``)
        take ``other``'s streams as they are now, then draw on their own, as a
        ``copy.deepcopy`` of each copy's ``Generator`` would (``where`` is read on the
        host only while some copy here has no stream yet)."""
        chosen = self.place.zeros((self.num_envs,), np.bool_) == 0
        if where is not None:
            chosen = self.place.asarray(where, np.bool_)
        for name in ("_hi", "_lo", "_inc_hi", "_inc_lo", "_buffer", "_buffered"):
            setattr(self, name, self._select(chosen, getattr(other, name), getattr(self, name)))
        if not self._seeded.all():
            host = np.ones(self.num_envs, np.bool_) if where is None else to_numpy(chosen)
            self._seeded = self._seeded | (other._seeded & host)

    def _advance(self, where: Array | None, hi: Array, lo: Array) -> None:
        """The LCG states of the copies ``where`` selects become ``hi``, ``lo``."""
        if where is not None:
            hi, lo = self._select(where, hi, self._hi), self._select(where, lo, self._lo)
        self._hi, self._lo = hi, lo

    def _next64(self, chosen: Array) -> Array:
        """PCG64's ``next_uint64`` of every copy; the ``chosen`` copies advance."""
        hi, lo = _step(self._hi, self._lo, self._inc_hi, self._inc_lo)
        self._advance(chosen, hi, lo)
        return _output(hi, lo)

    def _next32(self, chosen: Array) -> Array:
        """PCG64's ``next_uint32``: the upper half of the last 64-bit draw if a copy keeps
        one, else the lower half of a new draw, keeping its upper half."""
        buffered, select = self._buffered, self._select
        drawing = chosen & ~buffered
        fresh = self._next64(drawing)
        value = select(buffered, self._buffer, fresh & _MASK32)
        self._buffer = select(drawing, _shr(fresh, 32), self._buffer)
        self._buffered = buffered ^ chosen
        return value

    def _bounded(self, excl: int, bits: int, chosen: Array) -> Array:
        """Lemire's method, as numpy's: a value in ``[0, excl)`` from the high ``bits`` of a
        ``bits``-bit draw times ``excl``, drawn again while the low ``bits`` fall below
        ``2**bits % excl`` (which keeps every value equally likely)."""
        threshold = (1 << bits) % excl

        def scaled(drawing: Array) -> tuple[Array, Array]:
            if bits == 32:
                product = self._next32(drawing) * excl
                return _shr(product, 32), product & _MASK32
            draw = self._next64(drawing)
            return _mulhi(draw, excl), draw * _signed(excl)

        value, low_bits = scaled(chosen)
        pending, rounds = chosen & _below(low_bits, threshold), 1
        while self._may_reject(pending, rounds, threshold / 2.0**bits):
            again, low_bits = scaled(pending)
            value = self._select(pending, again, value)
            pending, rounds = pending & _below(low_bits, threshold), rounds + 1
        return value

    def _may_reject(self, pending: Array, rounds: int, chance: float) -> bool:
        """Whether another round of draws may be needed: on the host, whether a copy is
        still pending; on a device, until the chance that one is falls below 2**-64. A
        range whose size divides ``2**bits`` rejects nothing: no look at the copies."""
        if chance == 0:
            return False
        if self._on_host:
            return bool(pending.any())
        return self.num_envs * chance**rounds >= _NEGLIGIBLE


class _LcgState(TypedDict):
    """PCG64's 128-bit LCG state and increment, as ``PCG64().state["state"]`` holds them."""

    state: int
    inc: int


def _pcg64_state(seed: int | None, copy: int) -> _LcgState:
    """The 128-bit state and increment ``np.random.default_rng(seed)`` starts from."""
    try:
        return np.random.PCG64(seed).state["state"]
    except (TypeError, ValueError) as err:
        raise type(err)(f"copy {copy}: seed {seed!r} is not a numpy seed: {err}") from err


def _words(state: _LcgState) -> tuple[int, int, int, int]:
    """A PCG64 state and increment as four unsigned 64-bit words, high halves first."""
    s, inc = state["state"], state["inc"]
    return s >> 64, s & _MASK64, inc >> 64, inc & _MASK64


def _signed(word: int) -> int:
    """The int64 holding the bits of an unsigned 64-bit ``word``."""
    return word - (1 << 64) if word >> 63 else word


def _shr(x: Array, shift: int) -> Array:
    """The logical right shift of 64-bit words by ``shift`` (1..63) bits."""
    return (x >> shift) & ((1 << (64 - shift)) - 1)  # `>>` copies the sign bit


def _rotr(x: Array, shift: Array) -> Array:
    """64-bit words rotated right, each by its ``shift`` (0..63)."""
    # `x >> shift` fills the top `shift` bits with the sign bit; the xor sets them to the
    # bottom bits of x (in two left shifts: a shift by 64 is not defined).
    return (x >> shift) ^ ((((x >> 63) ^ x) << (63 - shift)) << 1)


def _below(x: Array, bound: Array | int) -> Array:
    """Whether the 64-bit words ``x`` are below ``bound`` (words, or an int below 2**64),
    read as unsigned."""
    # Flipping the top bit maps unsigned order onto signed order.
    bound = _signed(bound) if isinstance(bound, int) else bound
    return (x ^ _MIN64) < (bound ^ _MIN64)


def _mulhi(x: Array, factor: Array | int) -> Array:
    """The high 64 bits of the 128-bit product of 64-bit words ``x`` and ``factor`` (an int
    below 2**64, or words)."""
    # Schoolbook on 32-bit halves; no partial sum passes 2**64 (Hacker's Delight, mulhu).
    f1 = factor >> 32 if isinstance(factor, int) else _shr(factor, 32)
    x0, x1, f0 = x & _MASK32, _shr(x, 32), factor & _MASK32
    middle = x1 * f0 + _shr(x0 * f0, 32)
    low = x0 * f1 + (middle & _MASK32)
    return x1 * f1 + _shr(middle, 32) + _shr(low, 32)


def _step(hi: Array, lo: Array, inc_hi: Array, inc_lo: Array) -> tuple[Array, Array]:
    """The next LCG state, ``state * MULTIPLIER + inc`` modulo 2**128, as 64-bit halves."""
    new_lo = lo * _MUL_LO + inc_lo  # both halves of the multiplier are below 2**63
    carry = _below(new_lo, inc_lo)  # the low halves' sum wrapped
    new_hi = hi * _MUL_LO + lo * _MUL_HI + _mulhi(lo, _MUL_LO) + inc_hi + carry
    return new_hi, new_lo


def _mul128(x: tuple[Array, Array], y: tuple[Array, Array]) -> tuple[Array, Array]:
    """``x * y`` modulo 2**128, for 128-bit words as (high, low) 64-bit halves."""
    (x_hi, x_lo), (y_hi, y_lo) = x, y
    return x_hi * y_lo + x_lo * y_hi + _mulhi(x_lo, y_lo), x_lo * y_lo


def _add128(x: tuple[Array, Array], y: tuple[Array, Array]) -> tuple[Array, Array]:
    """``x + y`` modulo 2**128, for 128-bit words as (high, low) 64-bit halves."""
    lo = x[1] + y[1]
    return x[0] + y[0] + _below(lo, y[1]), lo


def _output(hi: Array, lo: Array) -> Array:
    """PCG64's XSL-RR output of a state: its halves xored, rotated right by its top 6 bits."""
    return _rotr(hi ^ lo, _shr(hi, 58))
