"""Which policy plays each agent: the policy map of a run.

A run maps every agent of its env to a *policy id*, and each policy id to
what plays it (``policies``, ``--policies "adversary=mappo,agent=fixed:random"``):

- an algorithm (``mappo``, ``ippo``, ``dqn``, ``maddpg`` or ``module:attr`` of an
  :class:`~corral.algos.base.Algorithm`): a learner of its own, trained in the run;
- ``fixed:random``: uniformly random legal actions;
- ``fixed:MODULE:ATTR``: a policy of yours, a :class:`~corral.algos.policy.Policy`
  or a :data:`~corral.algos.base.FixedPolicy` callable;
- ``RUN_DIR:POLICY``: the policy of another run (a policy id or a group of that run,
  from its ``best.pt``), played greedily (cross-play);
- in Python, such an object itself.

A key of the map is a group or an agent id; an agent named by its id takes
that entry over its group's, and agents that no key names are learned by the
run's algorithm (the policy id ``main``). The key is the policy id. A learned
policy plays whole groups (give an agent a group of its own with
``group_map="agent"`` to learn it apart); a fixed one may play single agents.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from corral.algos.policy import Policy
from corral.arrays import Place, to_numpy, tree_to_numpy
from corral.arrays.tree import map_tree
from corral.errors import ConfigError

if TYPE_CHECKING:
    from corral.vector.protocols import Batch

MAIN = "main"
"""The policy id of the agents that no key of the map names: the run's own algorithm."""
FIXED = "fixed:"
RANDOM = "fixed:random"
_KEY = re.compile(r"[A-Za-z_][\w.-]*")


def parse_policies(text: str) -> dict[str, str]:
    """``"adversary=mappo,agent=fixed:random"`` as a mapping of keys to values.

    Raises :class:`~corral.errors.ConfigError` naming the entry that is not ``KEY=VALUE``
    or a key given twice.
    """
    found: dict[str, str] = {}
    for entry in text.split(","):
        key, sep, value = (part.strip() for part in entry.partition("="))
        if not sep or not _KEY.fullmatch(key) or not value:
            raise ConfigError(
                f"policies: {entry.strip()!r} is not KEY=VALUE (a group or agent id, then an "
                "algorithm, fixed:random or fixed:MODULE:ATTR), in "
                f"{text!r}; e.g. --policies 'adversary=mappo,agent=fixed:random'"
            )
        if key in found:
            raise ConfigError(f"policies: {key!r} is given twice in {text!r}")
        found[key] = value
    return found


AgentMap = Callable[[str, int], str]
"""``(agent, episode) -> policy id``: a policy map by a function of the agent and the number
of its episode (see :class:`Seating`), for self-play's seat swapping and leagues."""


@dataclass(frozen=True)
class PolicyMap:
    """Each agent's policy id, and the slots of each policy id.

    Built by :func:`policy_map`; :attr:`agents` maps every agent of the env
    to its policy id.
    """

    groups: Mapping[str, tuple[str, ...]]
    agents: Mapping[str, str]
    by: AgentMap | None = None
    """A map by a function of agent and episode (then :attr:`agents` is empty, every
    policy may play any agent, and :class:`Seating` says which it plays when)."""
    named: tuple[str, ...] = ()
    """With :attr:`by`, the policy ids it may return."""

    @property
    def ids(self) -> tuple[str, ...]:
        """The policy ids, in the order of the agents they play first."""
        if self.by is not None:
            return self.named
        return tuple(dict.fromkeys(self.agents.values()))

    def groups_of(self, policy: str) -> dict[str, tuple[str, ...]]:
        """The groups in which ``policy`` plays some agent (group -> all its agents)."""
        if self.by is not None:
            return dict(self.groups)
        return {
            g: agents
            for g, agents in self.groups.items()
            if any(self.agents[a] == policy for a in agents)
        }

    def slots(self, policy: str) -> dict[str, np.ndarray]:
        """Per group of :meth:`groups_of`, ``[n_g]`` booleans: the agents ``policy`` plays."""
        if self.by is not None:
            return {g: np.ones(len(agents), dtype=bool) for g, agents in self.groups.items()}
        return {
            g: np.array([self.agents[a] == policy for a in agents], dtype=bool)
            for g, agents in self.groups_of(policy).items()
        }

    def whole_groups(self, policy: str) -> bool:
        """Whether ``policy`` plays every agent of each group it plays in."""
        return all(mask.all() for mask in self.slots(policy).values())


class Seating:
    """Who plays each agent of each env in its running episode, by an :data:`AgentMap`.

    Episodes are numbered per env, from the env's index: env ``e`` runs
    episode ``e`` first, then ``e + 1``, ``e + 2``... as its batches say
    ``done``. So a map by ``episode mod seats`` moves each env's learner to the
    next seat at every episode, and the envs start in different seats (the
    numbers are not unique across envs). :attr:`owned` holds, per policy id
    and group, the ``[E, n]`` agents it plays; :meth:`begin` seats the envs whose
    episode starts at a batch. ``first``: the index of the first env among a run's envs
    (a rollout worker's shard starts there), so that its envs are numbered as they are in
    one collector of all the run's envs.
    """

    def __init__(
        self,
        groups: Mapping[str, Sequence[str]],
        by: AgentMap,
        ids: Sequence[str],
        num_envs: int,
        *,
        first: int = 0,
    ) -> None:
        self.groups = {g: tuple(agents) for g, agents in groups.items()}
        self.by = by
        self.ids = tuple(ids)
        self.episode = np.arange(first, first + num_envs, dtype=np.int64)
        """The number of the episode running in each env."""
        self.owned = {
            pid: {g: np.zeros((num_envs, len(a)), dtype=bool) for g, a in self.groups.items()}
            for pid in self.ids
        }
        self._seat(range(num_envs))

    def begin(self, done: np.ndarray) -> None:
        """Number and seat the new episodes of the envs that are ``done`` ``[E]``."""
        envs = np.flatnonzero(done)
        if len(envs) == 0:
            return
        self.episode[envs] += 1
        self._seat(envs)

    def state_dict(self) -> dict[str, list[int]]:
        """The number of the episode running in each env."""
        return {"episode": self.episode.tolist()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue the numbering of :meth:`state_dict`: every env begins its next episode
        now (a resumed run's envs restart theirs)."""
        episode = np.asarray(state["episode"], dtype=np.int64)
        if episode.shape != self.episode.shape:
            raise ValueError(
                f"the seating was saved for {episode.size} envs, this run has {self.episode.size}"
            )
        self.episode = episode + 1
        self._seat(range(len(self.episode)))

    def _seat(self, envs: Any) -> None:
        for e in envs:
            for owned in self.owned.values():
                for mask in owned.values():
                    mask[e] = False
            episode = int(self.episode[e])
            for g, agents in self.groups.items():
                for j, agent in enumerate(agents):
                    pid = self.by(agent, episode)
                    if pid not in self.owned:
                        raise ValueError(
                            f"the policy map sent the agent {agent!r} of episode {episode} (env "
                            f"{e}) to {pid!r}, which is not a policy of the run: {list(self.ids)}"
                        )
                    self.owned[pid][g][e, j] = True


def policy_map(groups: Mapping[str, Sequence[str]], keys: Sequence[str]) -> PolicyMap:
    """The map that sends each agent to the key naming it (its own id first, then its
    group), and the agents that no key names to :data:`MAIN`.

    Raises :class:`~corral.errors.ConfigError` for a key that is neither a group nor an
    agent of ``groups`` (naming both), or for the key ``main``.
    """
    tuples = {g: tuple(agents) for g, agents in groups.items()}
    agent_ids = [a for agents in tuples.values() for a in agents]
    for key in keys:
        if key == MAIN:
            raise ConfigError(
                f"policies: {MAIN!r} is the policy id of the agents no key names (the run's "
                "algorithm); name a group or an agent instead"
            )
        if key not in tuples and key not in agent_ids:
            raise ConfigError(
                f"policies: {key!r} is neither a group nor an agent of this env; its groups: "
                f"{sorted(tuples)}, its agents: {agent_ids}"
            )
    chosen = set(keys)
    agents = {}
    for g, members in tuples.items():
        for a in members:
            agents[a] = a if a in chosen else g if g in chosen else MAIN
    return PolicyMap(tuples, agents)


OBJECT = "object:"
"""How ``config.yaml`` records a policy given as a Python object (``object:ClassName``)."""


def written(value: Any) -> str:
    """A ``policies`` value as ``config.yaml`` records it: a string as it is, an object as
    ``object:ClassName`` (it cannot be saved; :func:`check_value` refuses it when read)."""
    name = getattr(value, "__qualname__", None) or type(value).__qualname__
    return value if isinstance(value, str) else f"{OBJECT}{name}"


def check_value(key: str, value: Any) -> None:
    """Refuse a ``policies`` value that records a Python object (see :func:`written`), or
    names a path (``RUN_DIR:POLICY``) where no run directory is."""
    if not isinstance(value, str) or value.startswith(FIXED):
        return
    if value.startswith(OBJECT):
        raise ConfigError(
            f"policies: {key!r} was played by a Python object ({value.removeprefix(OBJECT)}) "
            "when the run was made, which a run directory cannot hold: build the run in Python "
            "with that object in policies={...}"
        )
    place = value.rpartition(":")[0] or value
    if "/" in place and not is_run_policy(value):  # a module's name holds no "/"
        raise ConfigError(
            f"policies: {key}={value}: {place} is not a run directory (it holds no "
            "config.yaml); another run's policy is RUN_DIR:POLICY"
        )


def is_fixed(value: Any) -> bool:
    """Whether a ``policies`` value names a policy that is not learned (``fixed:...``, another
    run's policy, or an object rather than an algorithm's name)."""
    return not isinstance(value, str) or value.startswith(FIXED) or is_run_policy(value)


def is_run_policy(value: Any) -> bool:
    """Whether a ``policies`` value is ``RUN_DIR:POLICY``: a policy of another run (a
    directory holding a ``config.yaml``)."""
    if not isinstance(value, str) or value.startswith(FIXED):
        return False
    run_dir = Path(value.rpartition(":")[0])
    return (run_dir / "config.yaml").is_file()


def fixed_target(value: str) -> str:
    """What ``fixed:...`` names: ``random`` or ``MODULE:ATTR``."""
    return value[len(FIXED) :]


class FixedPlayer:
    """A policy that is not learned, and the agents it plays.

    ``policy`` is a :class:`~corral.algos.policy.Policy` (its ``act(batch, explore=...)``
    gives actions ``[E, n, ...]`` per group) or a :data:`~corral.algos.base.FixedPolicy`
    callable ``(obs, action_mask, rng) -> actions`` of one group (or one per group, by
    group), called per group on the host with the collector's generator. ``slots``: per
    group, ``[n]`` booleans marking the agents it plays.
    """

    def __init__(self, policy: Any, slots: Mapping[str, np.ndarray]) -> None:
        self.policy = policy
        self.slots = {g: np.asarray(mask, dtype=bool) for g, mask in slots.items()}

    def learned(self, learner: Any) -> dict[str, float]:
        """Tell the policy that ``learner`` has just learned, where it listens (a ``learned``
        method, as self-play's :class:`~corral.algos.selfplay.SnapshotPool` has); returns
        the metrics it reports, to log with the learner's."""
        listens = getattr(self.policy, "learned", None)
        if not isinstance(self.policy, Policy) or listens is None:
            return {}
        return dict(listens(learner))

    def state_dict(self) -> dict[str, Any] | None:
        """The state of a policy that keeps some across a run (a ``state_dict`` method, as
        self-play's pool has), for checkpoints; ``None`` for one that keeps none."""
        if not isinstance(self.policy, Policy) or not hasattr(self.policy, "state_dict"):
            return None
        return self.policy.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.policy.load_state_dict(state)

    def actions(
        self, batch: Batch, place: Place, explore: bool, rng: np.random.Generator
    ) -> dict[str, Any]:
        """Its actions ``[E, n, ...]`` in each group of :attr:`slots`, placed where the batch
        lives (its other agents' entries are ignored)."""
        if isinstance(self.policy, Policy):
            actions, _ = self.policy.act(batch, explore=explore)
            missing = [g for g in self.slots if g not in actions]
            if missing:
                name = type(self.policy).__name__
                raise ValueError(
                    f"the policy {name} gave no actions for the group(s) {missing} it plays"
                )
            return {g: actions[g] for g in self.slots}
        out = {}
        for g in self.slots:
            # a callable plays on the host: a torch batch's observations and mask are read
            # back (one copy per step), the actions placed where the batch lives
            obs, mask = batch.obs[g], batch.action_mask.get(g)
            if place.is_torch:
                obs, mask = tree_to_numpy(obs), None if mask is None else to_numpy(mask)
            policy = self.policy[g] if isinstance(self.policy, Mapping) else self.policy
            out[g] = placed(place, policy(obs, mask, rng))
        return out


def placed(place: Place, actions: Any) -> Any:
    """Host actions (nested for Dict and Tuple spaces) in ``place``."""
    return map_tree(place.asarray, actions) if place.is_torch else actions
