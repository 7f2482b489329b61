"""A learning algorithm as two parts: a :class:`Policy` that acts and a :class:`Learner`
that improves it.

A :class:`Policy` maps parameters and a batch to actions and nothing else: its
:meth:`~Policy.act` changes no counter and no learning state (it may draw from
its own random generator), so the same weights act the same anywhere. Its
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

The runner drives an :class:`~corral.algos.base.Algorithm`; a split algorithm
(MAPPO, IPPO, DQN, MADDPG) is a facade over its policy and learner.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from corral.arrays import is_tensor
from corral.data.rollouts import Rollout

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
        batch: Any,
        *,
        explore: bool = True,
        decisions: Mapping[str, Any] | None = None,
    ) -> tuple[Actions, Extras]:
        """Actions ``[E, n, ...]`` of every agent of its groups in ``batch``, and extras.

        ``explore``: sample (``True``) or act greedily. ``decisions``: per group
        ``[E, n]``, each agent's decision index in its episode, in place of
        ``batch.decision`` (which a policy that reads it takes by default).
        Changes no state but the draws of the policy's own generator.
        """
        raise NotImplementedError

    def weights(self) -> Weights:
        """The parameters and :attr:`version`, as a picklable mapping of CPU tensors."""
        raise NotImplementedError

    def load_weights(self, weights: Weights) -> None:
        """Act with ``weights`` (from :meth:`weights` of a policy of the same shape)."""
        raise NotImplementedError


class Learner:
    """Improves :attr:`policy` from rollouts; see the module docstring."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.env_steps = 0
        """Env steps in the rollouts learned from (``T * E`` each)."""
        self._decisions: Any = 0  # a tensor on the rollouts' device, read back when asked
        self.updates = 0
        """Updates made (one per :meth:`learn`)."""

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
