"""Drive a vector env with a learner's actions, one time-major rollout at a time.

The :class:`RolloutCollector` is the :class:`~corral.training.collector.Collector`
of learners that learn from whole rollouts (``learns_from = "rollouts"``: MAPPO
and IPPO, and DQN and MADDPG, which write them into replay memories): it
records every vector step into a :class:`~corral.data.rollouts.RolloutBuilder`
and hands the learner one
:class:`~corral.data.rollouts.Rollout` per group every ``rollout_steps``
vector steps, with no per-agent rows assembled in Python.

On a vector env of torch tensors (``make_vec(..., array="torch")``) the
collector reads nothing back to the host per step (fixed policies of groups
not learned aside: they play on the host): the learner acts and learns on the
batches' device, and the episodes that ended are kept there and read back
once per rollout and at the end of :meth:`RolloutCollector.run` (the
:class:`~corral.training.collector.Progress` holds the same numbers as on NumPy),
as is the first invalid action of a vector env that checks them on its device
(``deferred_checks``, which the runner turns on there): it raises then.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from types import SimpleNamespace
from typing import Any

from corral.algos.base import Algorithm, FixedPolicy
from corral.arrays import is_tensor, to_numpy
from corral.data.rollouts import RolloutBuilder
from corral.training.collector import Collector, Progress
from corral.training.policy_map import MAIN, FixedPlayer


class RolloutCollector(Collector):
    """Steps ``venv`` with ``algo`` (and fixed policies for other groups), learning from
    rollouts of ``algo.rollout_steps`` vector steps.

    The learner's :meth:`act` gives, with its actions, any per-decision arrays
    it learns from and, for a learner with a critic, the extra ``value`` (of
    every agent's observation); :meth:`bootstrap_values` the values of the
    batch after a rollout's last step (``None``: no values); :meth:`learn`
    learns from the rollouts. A decision still open when
    a rollout ends (a turn-based agent waiting for its turn) is learned from
    in the next one, as the transition assembler would complete it.
    """

    def __init__(
        self,
        venv: Any,
        algo: Algorithm | Mapping[str, Algorithm],
        fixed: Mapping[str, FixedPlayer | FixedPolicy] | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__(venv, algo, fixed, seed)
        self.builders = {
            pid: RolloutBuilder(
                SimpleNamespace(num_envs=venv.num_envs, groups=learner.groups),
                learner.rollout_steps,
                record_next=learner.records_next,
            )
            for pid, learner in self.learners.items()
        }
        self._ended: list[tuple[Any, dict[str, Any], Any, Any]] = []
        """Torch batches: each step's ``done``, ``episode_return``, ``episode_length`` and
        ``episode_cut``, on the device until :meth:`_read_episodes`."""

    @property
    def builder(self) -> RolloutBuilder:
        """The only learner's rollout builder (see :attr:`Collector.algo`)."""
        if len(self.builders) != 1:
            raise ValueError(f"this collector has several learners: {sorted(self.builders)}")
        return next(iter(self.builders.values()))

    @property
    def rollout_open(self) -> bool:
        """Whether a rollout is partly collected: its steps would be lost to a checkpoint."""
        return any(b.recorded > 0 for b in self.builders.values())

    def rollout_left(self) -> int:
        """The env steps until no learner's rollout is open (0 where none is open): learners
        of different ``rollout_steps`` close theirs together every so many steps."""
        if not self.rollout_open:
            return 0
        horizon = math.lcm(*(b.steps for b in self.builders.values()))
        for steps in range(1, horizon + 1):
            if all((b.recorded + steps) % b.steps == 0 for b in self.builders.values()):
                return steps * self.venv.num_envs
        raise AssertionError("unreachable: every rollout closes within their lcm")

    def run(
        self,
        env_steps: int,
        *,
        learn: bool = True,
        on_step: Callable[[int], None] | None = None,
    ) -> Progress:
        """Collect at least ``env_steps`` env steps, each learner learning at the end of each
        of its rollouts.

        ``on_step`` is called after every vector step with the env steps it took.
        """
        if learn and self.overridden:
            raise ValueError(
                f"the agents {self.overridden} are played by both a learner and a fixed policy: "
                "a collector plays so only without learning"
            )
        progress = Progress()
        if not learn:
            for builder in self.builders.values():
                builder.reset()  # a rollout never spans acting without learning
        # worker_restarts only grows: the restarts of the run are its growth over the run
        restarts = self.batch.worker_restarts.sum()
        while progress.env_steps < env_steps:
            actions, extras = self.actions(self.batch, explore=learn)
            if learn:
                for pid, learner in self.learners.items():
                    own = dict(extras[pid])
                    value = own.pop("value", None)
                    self.builders[pid].act(
                        self.batch, {g: actions[g] for g in learner.groups}, value, **own
                    )
            self.batch = self.venv.step(actions)
            progress.env_steps += self.venv.num_envs
            self._record_episodes(progress)
            if learn:
                for pid, learner in self.learners.items():
                    self._learn(pid, learner, progress)
            if on_step is not None:
                on_step(self.venv.num_envs)
        self._read_episodes(progress)
        self._raise_deferred()
        progress.env_restarts += int(self.batch.worker_restarts.sum() - restarts)
        return progress

    def _learn(self, pid: str, learner: Algorithm, progress: Progress) -> None:
        """Record the step into ``pid``'s rollout; where it is full, learn from it."""
        builder = self.builders[pid]
        builder.observe(self.batch, learner.final_values(self.batch, self.decisions.made))
        if not builder.full:
            return
        next_value = learner.bootstrap_values(self.batch, self.decisions.index(self.batch))
        rollouts = builder.finish(next_value)
        self._read_episodes(progress)
        self._raise_deferred()  # not learning from a bad action's stand-in
        metrics = learner.learn(rollouts)
        if metrics:  # a replay learner's rollout that took no gradient step: none
            progress.updates.append(_named(pid, metrics))

    def _raise_deferred(self) -> None:
        """Raise an invalid action that the vector env checked on its device
        (``deferred_checks``) since the last look: one read per rollout."""
        raise_deferred = getattr(self.venv, "raise_deferred", None)
        if raise_deferred is not None:
            raise_deferred()

    def _record_episodes(self, progress: Progress, batch: Any = None) -> None:
        """As the collector's, but a torch batch's episodes stay on the device until
        :meth:`_read_episodes`."""
        batch = self.batch if batch is None else batch
        if not is_tensor(batch.done):
            super()._record_episodes(progress, batch)
            return
        returns = {g: batch.episode_return[g] for g in self.venv.groups}
        ended = (batch.done, batch.episode_length, batch.episode_cut)
        if getattr(self.venv, "copy", True) is False:  # views the next step overwrites
            returns = {g: r.clone() for g, r in returns.items()}
            ended = tuple(x.clone() for x in ended)
        done, length, cut = ended
        self._ended.append((done, returns, length, cut))

    def _read_episodes(self, progress: Progress) -> None:
        """Read the kept steps' episodes back to the host at once, into ``progress``."""
        if not self._ended:
            return
        import torch

        steps, self._ended = self._ended, []
        flat = SimpleNamespace(
            done=to_numpy(torch.cat([done for done, _, _, _ in steps])),
            episode_return={
                g: to_numpy(torch.cat([r[g] for _, r, _, _ in steps])) for g in self.venv.groups
            },
            episode_length=to_numpy(torch.cat([length for _, _, length, _ in steps])),
            episode_cut=to_numpy(torch.cat([cut for _, _, _, cut in steps])),
        )
        super()._record_episodes(progress, flat)


def _named(pid: str, metrics: dict[str, float]) -> dict[str, float]:
    """A learner's metrics as the run logs them: those of the policy :data:`MAIN` as they
    are, others' prefixed ``pid/`` (unless their names already start so)."""
    if pid == MAIN:
        return metrics
    return {k if k.startswith(f"{pid}/") else f"{pid}/{k}": v for k, v in metrics.items()}
