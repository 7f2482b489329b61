"""A learning algorithm as two parts: a :class:`Policy` that acts and a :class:`Learner`
that improves it.

A :class:`Policy` maps parameters and a batch to actions and nothing else: its
:meth:`~Policy.act` changes no counter and no learning state (it may draw from
its own random generator, and a recurrent policy keeps the agents' memories of their
episodes), so the same weights act the same anywhere. Its
:meth:`~Policy.weights` are a picklable mapping of CPU tensors with the
:attr:`~Policy.version` that produced them; :meth:`~Policy.load_weights` puts
them into another copy (a rollout worker's, later), which can skip versions it
already holds.

A :class:`Learner` owns a policy (:attr:`Learner.policy`) and the optimisers
of its networks and learns from the :class:`~corral.data.rollouts.Rollout`
arrays it receives. Its counters come from those arrays, not from acting:
:attr:`~Learner.env_steps` adds ``T * E`` per rollout, :attr:`~Learner.decisions`
the agents' decisions the rollouts record, :attr:`~Learner.updates` one per
:meth:`~Learner.learn`, which also bumps the policy's version.

The collector and the runner drive learners: an algorithm (MAPPO, IPPO, DQN,
MADDPG; :class:`~corral.algos.base.Algorithm`) is its learner, built for a
vector env together with its policy; the collector acts with the learner's
policy and feeds the learner its rollouts.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import numpy as np

from corral.arrays import is_tensor
from corral.data.rollouts import Rollout

if TYPE_CHECKING:
    from corral.vector.protocols import Batch


class FirstUpdate(NamedTuple):
    """When a learner can next update: the fewest env steps from now, and what sets them."""

    env_steps: int
    """Env steps (one per env per vector step) to collect before the next update."""
    because: str
    """The settings behind that number, e.g. ``rollout_steps=64 vector steps of 16 envs``."""


Actions = dict[str, Any]
"""Per group, the actions ``[E, n, ...]`` of every agent."""
Extras = dict[str, dict[str, Any]]
"""Per name, per group, arrays ``[E, n, ...]`` to keep with the actions (``log_prob``...)."""
Weights = dict[str, Any]
"""What :meth:`Policy.weights` returns: ``{"version": int, "params": {...}}``, CPU tensors
and plain values only, so it pickles and travels to another process unchanged."""


class Policy:
    """Parameters -> actions for a batch; see the module docstring.

    Args:
        groups: the groups it acts for (group -> its agents).
    """

    def __init__(self, groups: Mapping[str, Sequence[str]]) -> None:
        self.groups = {g: tuple(agents) for g, agents in groups.items()}
        self.version = 0
        """Updates behind the current weights; the learner bumps it after each update."""

    def act(
        self,
        batch: Batch,
        *,
        explore: bool = True,
        decisions: Mapping[str, Any] | None = None,
    ) -> tuple[Actions, Extras]:
        """Actions ``[E, n, ...]`` of every agent of its groups in ``batch``, and extras.

        ``explore``: sample (``True``) or act greedily. ``decisions``: per group
        ``[E, n]``, each agent's decision index in its episode, in place of
        ``batch.decision`` (which a policy that reads it takes by default).
        Changes no state but the draws of the policy's own generator (and a recurrent
        policy's memory of the agents' episodes, see :mod:`corral.algos.recurrent`).
        """
        raise NotImplementedError

    def bootstrap_values(
        self, batch: Batch, decisions: Mapping[str, Any] | None = None
    ) -> dict[str, Any] | None:
        """A policy with a critic: the value ``[E, n]`` of every agent's observation in
        ``batch`` (what a rollout ending there bootstraps from); ``None``: it has no values."""
        return None

    def final_values(
        self, batch: Batch, decisions: Mapping[str, Any] | None = None
    ) -> dict[str, Any] | None:
        """A policy with a critic: the value ``[E, n]`` of every agent's next observation after
        the step that returned ``batch``, which truncated decisions bootstrap from; ``None``:
        they bootstrap nothing."""
        return None

    def acting_state(self) -> Any:
        """What acting changes: the state of every random generator the policy holds (NumPy
        and torch generators among its attributes) and a recurrent policy's ``memory``.
        Acting that must leave no trace (an evaluation during training) gives it back to
        :meth:`restore_acting_state` afterwards, so that training draws and remembers as if
        it had not happened."""
        held = vars(self).items()
        streams = {name: _state(value) for name, value in held if _is_generator(value)}
        memory = getattr(self, "memory", None)
        kept = {mode: dict(m) for mode, m in memory.items()} if memory is not None else None
        return streams, kept

    def restore_acting_state(self, state: Any) -> None:
        """Put back what :meth:`acting_state` returned."""
        streams, memory = state
        for name, saved in streams.items():
            _set_state(getattr(self, name), saved)
        if memory is not None:
            self.memory = memory

    def weights(self) -> Weights:
        """The parameters and :attr:`version`, as a picklable mapping of CPU tensors."""
        raise NotImplementedError

    def load_weights(self, weights: Weights) -> None:
        """Act with ``weights`` (from :meth:`weights` of a policy of the same shape)."""
        raise NotImplementedError


class Learner:
    """Improves :attr:`policy` from rollouts; see the module docstring.

    What the collector reads of a learner: :attr:`groups` (its policy's),
    :attr:`rollout_steps` and :attr:`records_next` (how its rollouts are
    recorded), and :meth:`learn`; the runner also :meth:`first_update`, the
    state and replay memory for checkpoints, and self-play's pool
    :meth:`snapshot` and :meth:`snapshot_clock`.
    """

    records_next: ClassVar[bool] = False
    """Whether its rollouts record each step's next observations (``RolloutBuilder``'s
    ``record_next``), from which a replay learner makes its rows."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.env_steps = 0
        """Env steps in the rollouts learned from (``T * E`` each)."""
        self._decisions: Any = 0  # a tensor on the rollouts' device, read back when asked
        self.updates = 0
        """Updates made (one per :meth:`learn`)."""

    @property
    def groups(self) -> dict[str, tuple[str, ...]]:
        """The groups its policy acts for and it learns (group -> its agents)."""
        return self.policy.groups

    @property
    def rollout_steps(self) -> int:
        """Vector steps per rollout learned from (``config.rollout_steps``)."""
        return int(self.config.rollout_steps)  # type: ignore[attr-defined]

    def first_update(self) -> FirstUpdate | None:
        """A lower bound on the env steps before :meth:`learn` can next update (``None``:
        unknown); the runner warns when a run is too short for any update."""
        return None

    def snapshot(self) -> Weights:
        """Its policy's weights as a frozen self-play opponent acts with them (see
        :class:`~corral.algos.selfplay.SnapshotPool`): copies that never change."""
        return self.policy.weights()

    def snapshot_clock(self) -> int:
        """What self-play's ``snapshot_interval`` counts: :attr:`updates`."""
        return self.updates

    def replay_state_dict(self) -> dict[str, Any] | None:
        """An off-policy learner's replay memory, kept apart from :meth:`state_dict` so that
        only resumable checkpoints carry it; ``None`` for a learner that keeps none."""
        return None

    def load_replay_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`replay_state_dict`."""
        raise NotImplementedError(f"{type(self).__name__} keeps no replay memory to restore")

    @property
    def decisions(self) -> int:
        """The agents' decisions recorded in the rollouts learned from: the acting agents of
        every step, each decision counted once (a decision carried into the next rollout
        counts where it was made), only the learner's seats under self-play."""
        return int(self._decisions)

    def learn(self, rollouts: Mapping[str, Rollout]) -> dict[str, float]:
        """Count ``rollouts`` (one per group, of the same steps), :meth:`update` from them and
        bump the policy's version; returns the update's metrics."""
        self.count(rollouts)
        metrics = self.update(rollouts)
        self.updated()
        return metrics

    def update(self, rollouts: Mapping[str, Rollout]) -> dict[str, float]:
        """One update of the policy's parameters from ``rollouts``; returns scalar metrics."""
        raise NotImplementedError

    def count(self, rollouts: Mapping[str, Rollout]) -> None:
        """Add the env steps and decisions that ``rollouts`` hold to the counters."""
        if not rollouts:
            return
        steps, envs = next(iter(rollouts.values())).acting.shape[:2]
        self.env_steps += int(steps) * int(envs)
        for rollout in rollouts.values():
            made = rollout.acting.clone() if is_tensor(rollout.acting) else rollout.acting.copy()
            made[0] &= ~rollout.carried  # counted in the rollout that made them
            if "learner" in rollout.extras:
                made &= rollout.extras["learner"]
            self._decisions = self._decisions + made.sum()

    def updated(self) -> None:
        """Count an update: :attr:`updates` and the policy's :attr:`~Policy.version`."""
        self.updates += 1
        self.policy.version += 1

    def state_dict(self) -> dict[str, Any]:
        """The counters and the policy's version; a subclass adds networks and optimisers."""
        return {
            "env_steps": self.env_steps,
            "decisions": self.decisions,
            "updates": self.updates,
            "version": self.policy.version,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.updates = int(state["updates"])
        self.env_steps = int(state["env_steps"])
        self._decisions = int(state["decisions"])
        self.policy.version = int(state["version"])


def _is_generator(value: Any) -> bool:
    """Whether ``value`` is a NumPy or a torch random generator (torch is not imported here:
    a policy without it holds no torch generator)."""
    if isinstance(value, np.random.Generator):
        return True
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Generator)


def _state(generator: Any) -> Any:
    """A copy of a NumPy or torch generator's state."""
    if isinstance(generator, np.random.Generator):
        return generator.bit_generator.state
    return generator.get_state()


def _set_state(generator: Any, state: Any) -> None:
    """Put back what :func:`_state` copied."""
    if isinstance(generator, np.random.Generator):
        generator.bit_generator.state = state
    else:
        generator.set_state(state)
