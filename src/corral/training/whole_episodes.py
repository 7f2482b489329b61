"""Evaluations average whole episodes only.

An episode that a fault cut (``batch.episode_cut``: its env raised or returned
a bad value, its worker died or missed the timeout, under
``on_env_error=restart``) ended early, with the return of its steps so far:
on ``mpe2/simple_spread_v3`` a cut episode of length 0 scores 0.0, better than
any whole one. So evaluations leave cut episodes out, play on to replace them,
and report how many there were (``eval_cut``). An env that keeps failing
cannot keep an evaluation playing: past as many cut episodes as the
evaluation averages, it gives up with an :class:`~corral.errors.EvaluationError`.

Each env plays a share of an evaluation's episodes fixed before it starts
(:func:`episode_quota`). Keeping the first episodes to end instead would keep
the short ones: where episodes end early (a prey caught, a game won fast),
the average would depend on ``num_envs`` and favour them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from corral.errors import EvaluationError

if TYPE_CHECKING:
    from corral.vector.protocols import EndedEpisodes


def episode_quota(episodes: int, num_envs: int) -> np.ndarray:
    """How many of ``episodes`` each of ``num_envs`` envs plays: equal shares, one more for
    the first ``episodes % num_envs`` envs (``[E]`` ints)."""
    return episodes // num_envs + (np.arange(num_envs) < episodes % num_envs)


def whole_ended(batch: EndedEpisodes) -> np.ndarray:
    """The envs whose episode ended at ``batch`` as the env ended it (``done``, not cut):
    a NumPy bool array ``[E]``."""
    return np.asarray(batch.done) & ~np.asarray(batch.episode_cut)


class CutEpisodes:
    """Counts the episodes that faults cut while an evaluation plays ``episodes`` whole
    ones, and gives up past ``episodes`` of them."""

    def __init__(self, episodes: int) -> None:
        self.episodes = episodes
        self.count = 0
        """Cut episodes seen so far."""
        self.envs: set[int] = set()
        """The envs whose episodes were cut."""

    def see(self, batch: EndedEpisodes, among: Any = None, *, played: int = 0) -> None:
        """Count the episodes cut at ``batch`` (of the envs ``among``, a bool mask; all for
        ``None``); ``played``: the whole episodes played so far, for the error.

        Raises :class:`~corral.errors.EvaluationError` once more than ``episodes`` were cut.
        """
        cut = np.asarray(batch.done) & np.asarray(batch.episode_cut)
        if among is not None:
            cut &= among
        found = np.flatnonzero(cut)
        if not len(found):
            return
        self.count += len(found)
        self.envs.update(int(e) for e in found)
        if self.count > self.episodes:
            envs = ", ".join(str(e) for e in sorted(self.envs))
            raise EvaluationError(
                f"the evaluation gave up: faults cut {self.count} episodes (of envs {envs}) "
                f"while it played {played} of the {self.episodes} whole episodes it averages; "
                f"it replaces at most {self.episodes} cut ones. The warnings above name each "
                "env's fault (on_env_error=restart)"
            )
