"""numpy's ``Generator.choice(m, size=n, replace=False)`` for many copies at once, bit for bit:
on the host from each copy's generator (:class:`Choices`), and in torch from each copy's
stream on any device (:class:`StreamChoices`). ``corral/tag`` draws its agents' cells so."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from corral.arrays import CopyStreams, import_torch
from corral.batched_env import Array


class Choices:
    """``generator.choice(m, size=n, replace=False)`` of many copies' generators at once,
    bit for bit, without a Python call per copy where it can.

    numpy draws it (for ``m <= 10000``, and larger ``m`` with small ``n``) with Floyd's
    algorithm, then shuffles the ``n`` values, each step a bounded integer (Lemire's
    method) from the 32-bit words of the generator's 64-bit outputs (the low half first).
    Each copy's words are read ahead from its generator's ``random_raw`` and the draws of
    all copies are computed as array operations. Where this numpy draws differently
    (checked once per ``(m, n)``), or for other sizes, each copy calls ``choice``.
    """

    WORDS = 256  # words read ahead per copy: 36 draws of 4 agents' cells

    def __init__(self, num_copies: int, m: int, n: int, *, check: bool = True) -> None:
        self.m, self.n = m, n
        # The bound of each bounded integer of a draw: Floyd's, then the shuffle's.
        self.bounds = np.array([*range(max(m - n, 1), m), *range(n - 1, 0, -1)], np.uint64)
        span = self.bounds + np.uint64(1)
        self.spans: np.ndarray = span
        self.thresholds: np.ndarray = (np.uint64(2**32) - span) % span
        self.size = max(self.WORDS, 2 * len(self.bounds))
        self.words = np.zeros((num_copies, self.size), np.uint32)
        self.next = np.zeros(num_copies, np.int64)  # each copy's next unread word
        self.end = np.zeros(num_copies, np.int64)  # and the end of its words
        self.sources: list[np.random.Generator | None] = [None] * num_copies
        self.sourced = np.zeros(num_copies, bool)
        # Draws computed ahead from the words, for many copies at once (a reset of a few
        # copies then reads theirs): [copy, draw, value], each copy's next and end.
        self.ahead = self.size // max(len(self.bounds), 1)
        dtype = np.int16 if m <= np.iinfo(np.int16).max else np.int64
        self.ready = np.zeros((num_copies, self.ahead, n), dtype)
        self.ready_at = np.zeros(num_copies, np.int64)
        self.ready_end = np.zeros(num_copies, np.int64)
        # Floyd's algorithm on 32-bit words is numpy's way for these sizes.
        floyd = 0 < n <= m < 2**32 and not (m > 10000 and n > m // 50)
        self.exact = floyd and (not check or _emulation_matches(m, n))

    def choose(
        self, generators: Sequence[np.random.Generator] | None, rows: np.ndarray
    ) -> np.ndarray:
        """``[n, K]``: copy ``rows[k]``'s draw from its generator ``generators[k]`` (for
        ``None``: the generator of its last draw, where ``exact``)."""
        if not self.exact:
            out = np.empty((len(rows), self.n), np.int64)
            for k, generator in enumerate(generators or ()):
                out[k] = generator.choice(self.m, size=self.n, replace=False)
            return out.T
        for i, generator in zip(rows.tolist(), generators or (), strict=generators is not None):
            if generator is not self.sources[i]:  # a new generator: forget what was read
                self.sources[i], self.next[i], self.end[i] = generator, 0, 0
                self.ready_at[i] = self.ready_end[i] = 0
                self.sourced[i] = True
        at = self.ready_at[rows]
        if (at >= self.ready_end[rows]).any():
            self._prepare()
            at = self.ready_at[rows]
        have = at < self.ready_end[rows]
        out = self.ready[rows, at].T.astype(np.int64)
        self.ready_at[rows] = at + have
        if not have.all():  # a copy whose next draw has a word that Lemire's method rejects
            lacking = np.flatnonzero(~have)
            out[:, lacking] = self._direct(rows[lacking])
        return out

    def _prepare(self) -> None:
        """Compute ahead the draws of every copy (with a generator) that has half of them or
        fewer left, those with none among them: one read of words per copy for many draws,
        and the copies' draws computed together, so that most calls only read draws. A
        copy's draws stop before one that has a word that Lemire's method rejects
        (:meth:`_direct` draws that one)."""
        ahead, d, n = self.ahead, len(self.bounds), self.n
        left = self.ready_end - self.ready_at
        batch = np.flatnonzero((left <= ahead // 2) & self.sourced)
        count = len(batch)
        kept = left[batch]
        moved = np.flatnonzero(kept)
        if len(moved):  # the draws a copy has left, to the front
            copies = batch[moved]
            index = np.minimum(self.ready_at[copies][:, None] + np.arange(ahead), ahead - 1)
            self.ready[copies] = self.ready[copies[:, None], index]
        for i in batch.tolist():  # every copy's words from its first
            self._refill(i)
        room = ahead - kept
        if d:
            room = np.minimum(room, self.end[batch] // d)
        # Each word times its bound's span: the low 32 bits say whether Lemire's method
        # rejects the word, the high 32 bits are the bounded integer.
        scaled = self.words[batch, : ahead * d] * np.tile(self.spans, ahead)
        halves = scaled.astype("<u8", copy=False).view("<u4").reshape(count, ahead, d, 2)
        rejected = (halves[..., 0] < self.thresholds.astype(np.uint32)).any(2)
        room = np.minimum(room, np.where(rejected.any(1), rejected.argmax(1), ahead))
        values = halves[..., 1].astype(np.int64).reshape(count * ahead, d)
        draws = self._arrange(values).T.reshape(count, ahead, n)
        b, k = np.nonzero(np.arange(ahead) < room[:, None])
        self.ready[batch[b], kept[b] + k] = draws[b, k]
        self.ready_at[batch] = 0
        self.ready_end[batch] = kept + room
        self.next[batch] = room * d

    def _direct(self, rows: np.ndarray) -> np.ndarray:
        """``[n, K]``: the next draw of each copy of ``rows``, read from its words."""
        d = len(self.bounds)
        for i in rows[self.end[rows] - self.next[rows] < d].tolist():
            self._refill(i)
        at = self.next[rows]
        scaled = self.words[rows[:, None], at[:, None] + np.arange(d)] * self.spans
        self.next[rows] = at + d
        out = self._arrange((scaled >> np.uint64(32)).astype(np.int64))
        # A word that Lemire's method rejects (rare for small bounds) shifts the rest.
        again = np.flatnonzero(((scaled & np.uint64(0xFFFFFFFF)) < self.thresholds).any(1))
        if len(again):
            self.next[rows[again]] = at[again]
            out[:, again] = self._arrange(self._one_by_one(rows[again]))
        return out

    def _arrange(self, values: np.ndarray) -> np.ndarray:
        """``[n, K]``: the draws, from each copy's bounded integers ``[K, len(bounds)]``."""
        m, n, k = self.m, self.n, len(values)
        out, d = np.empty((n, k), np.int64), 0
        for t, j in enumerate(range(m - n, m)):  # Floyd: a value in [0, j], or j if taken
            value = values[:, d] if j else np.zeros(k, np.int64)
            d += j > 0
            if t:
                taken = out[0] == value
                for s in range(1, t):  # (numpy's any() along a short axis is slow)
                    taken |= out[s] == value
                value = np.where(taken, j, value)
            out[t] = value
        flat, columns = out.reshape(-1), np.arange(k)
        for i in range(n - 1, 0, -1):  # the shuffle: swap value i with value [0, i]
            other = values[:, d] * k + columns  # its place in out, flat
            d += 1
            picked = flat[other]
            flat[other] = out[i]
            out[i] = picked
        return out

    def _one_by_one(self, rows: np.ndarray) -> np.ndarray:
        """The bounded integers of the copies ``rows``, drawing again after a rejection."""
        values = np.empty((len(rows), len(self.bounds)), np.int64)
        for d, (span, threshold) in enumerate(zip(self.spans, self.thresholds, strict=True)):
            scaled = self._next_words(rows) * span
            redraw = np.flatnonzero((scaled & np.uint64(0xFFFFFFFF)) < threshold)
            while len(redraw):
                scaled[redraw] = self._next_words(rows[redraw]) * span
                redraw = redraw[(scaled[redraw] & np.uint64(0xFFFFFFFF)) < threshold]
            values[:, d] = scaled >> np.uint64(32)
        return values

    def _next_words(self, rows: np.ndarray) -> np.ndarray:
        """The next 32-bit word of each copy in ``rows`` (as uint64)."""
        for i in rows[self.next[rows] >= self.end[rows]].tolist():
            self._refill(i)
        at = self.next[rows]
        self.next[rows] = at + 1
        return self.words[rows, at].astype(np.uint64)

    def _refill(self, i: int) -> None:
        left = self.words[i, self.next[i] : self.end[i]].copy()
        source = self.sources[i]
        assert source is not None  # a copy refills only after a draw from its generator
        raw = source.bit_generator.random_raw((self.size - len(left)) // 2)
        end = len(left) + 2 * len(raw)
        self.words[i, : len(left)] = left
        self.words[i, len(left) : end] = raw.astype("<u8", copy=False).view("<u4")  # low first
        self.next[i], self.end[i] = 0, end


class StreamChoices:
    """``Generator.choice(m, size=n, replace=False)`` of every copy's stream at once, in
    torch, where numpy draws it with Floyd's algorithm and a shuffle (see :class:`Choices`;
    ``Choices(...).exact`` says where), with no host read or copy.

    The bounded integers of a draw come from words read ahead
    (:meth:`CopyStreams.peek_words`): as many as make the chance that Lemire's method
    skips too many of them for some copy in a call fall below ``2**-64``, as
    :class:`CopyStreams` draws on a device. With ``check`` (on the host), whether they
    sufficed is read, and more words are read ahead where not; without, nothing is read."""

    def __init__(self, streams: CopyStreams, m: int, n: int, check: bool = True) -> None:
        torch = self.torch = import_torch()
        self.streams, self.m, self.n, self.check = streams, m, n, check
        # Each bounded integer's range [0, bound]: Floyd's (none for 0), then the shuffle's.
        bounds = [j for j in range(m - n, m) if j] + list(range(n - 1, 0, -1))
        sizes = np.array(bounds, np.int64) + 1
        thresholds = (1 << 32) % sizes  # a word whose low half falls below is skipped
        chance = float(thresholds.max(initial=0)) / 2**32
        self.extra = _extra_words(streams.num_envs, len(bounds), chance)
        place, e = streams.place, streams.num_envs
        self.sizes, self.thresholds = place.from_host(sizes), place.from_host(thresholds)
        self.zero = place.zeros((e,), np.int64)
        self.before = torch.full((e,), -1, dtype=torch.int64, device=self.zero.device)

    def __call__(self, where: Array | None = None) -> Array:
        """``[n, E]``: each copy's draw; the copies ``where`` selects (a bool tensor
        ``[E]``, all for ``None``) advance their streams, the others' values are
        unspecified (in ``[0, m)``)."""
        torch, m, n = self.torch, self.m, self.n
        values = self._bounded(where)
        out: list[Array] = []
        for t, j in enumerate(range(m - n, m)):  # Floyd: a value in [0, j], or j if taken
            value = values.pop(0) if j else self.zero
            if t:
                taken = out[0] == value
                for s in range(1, t):
                    taken |= out[s] == value
                value = torch.where(taken, j, value)
            out.append(value)
        drawn = torch.stack(out)
        for i in range(n - 1, 0, -1):  # the shuffle: swap value i with value [0, i]
            other = values.pop(0)[None]
            picked = drawn.gather(0, other)
            drawn.scatter_(0, other, drawn[i : i + 1].clone())
            drawn[i] = picked[0]
        return drawn

    def _bounded(self, where: Array | None) -> list[Array]:
        """Each copy's next bounded integers, ``[E]`` int64 each, as numpy's
        ``random_bounded_uint64`` draws them one after the other (Lemire's method on 32-bit
        words: the high half of a word times the range's size, a word whose low half falls
        below ``2**32 % size`` skipped); the copies ``where`` selects draw the words used."""
        torch, d, extra = self.torch, len(self.sizes), self.extra
        if not d:
            return []
        while True:
            words = self.streams.peek_words(d + extra)
            scaled = words[:, :, None] * self.sizes  # the bits of the 64-bit products
            kept = (scaled & 0xFFFFFFFF) >= self.thresholds
            positions = torch.arange(d + extra, device=words.device)
            at, found, out = self.before, None, []
            for k in range(d):  # the first kept word past the last one used
                usable = kept[:, :, k] & (positions > at[:, None])
                if self.check:
                    found = usable.any(1) if found is None else found & usable.any(1)
                at = usable.to(torch.int8).argmax(1)
                out.append((scaled[:, :, k].gather(1, at[:, None])[:, 0] >> 32) & 0xFFFFFFFF)
            if found is None or bool(found.all()):  # found is None: not checked
                break
            extra = 2 * extra + 1
        self.streams.skip_words(at + 1, where)
        return out


def _extra_words(copies: int, d: int, chance: float) -> int:
    """How many words past ``d`` to read ahead so that ``d`` bounded integers of
    ``copies`` copies, each word skipped with a chance at most ``chance``, need more with
    a chance below 2**-64 (more than ``x`` skipped among ``d + x`` words: at most
    ``C(d + x, x + 1) * chance**(x + 1)`` per copy)."""
    x = 0
    while chance and copies * math.comb(d + x, x + 1) * chance ** (x + 1) >= 2.0**-64:
        x += 1
    return x


def _emulation_matches(m: int, n: int) -> bool:
    """Whether :class:`Choices` draws what this numpy's ``Generator.choice`` draws."""
    return _EMULATION_MATCHES.setdefault((m, n), _compare_with_numpy(m, n))


def _compare_with_numpy(m: int, n: int, copies: int = 3, draws: int = 40) -> bool:
    probe = Choices(copies, m, n, check=False)
    ours = [np.random.default_rng(seed) for seed in range(copies)]
    theirs = [np.random.default_rng(seed) for seed in range(copies)]
    for _ in range(draws):
        expected = np.stack([g.choice(m, size=n, replace=False) for g in theirs], 1)
        if not np.array_equal(probe.choose(ours, np.arange(copies)), expected):
            return False
    return True


_EMULATION_MATCHES: dict[tuple[int, int], bool] = {}
