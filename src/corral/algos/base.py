"""What every learning algorithm gives the collector and the runner.

An :class:`Algorithm` acts on vector batches and learns from the time-major
rollouts that the collector (:mod:`corral.training.collector`) records. An
algorithm split into a :class:`~corral.algos.policy.Policy` and a
:class:`~corral.algos.policy.Learner` (MAPPO, IPPO, DQN, MADDPG) is a facade
over the two (:attr:`Algorithm.policy`, :attr:`Algorithm.learner`); an
algorithm that is not split (a test's tabular learner) implements the methods
itself. Groups it does not learn (a fixed opponent) are played by
:data:`FixedPolicy` callables that the collector merges in. The algorithm
never steps an env itself, so one collector and one runner serve MAPPO, IPPO,
MADDPG and DQN alike.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Annotated, Any, ClassVar, NamedTuple

import numpy as np

from corral.algos.policy import Actions, Extras, Learner, Policy, Weights
from corral.data.rollouts import Rollout
from corral.errors import UnsupportedEnvError
from corral.ranges import SEED, Range, check_ranges

FixedPolicy = Callable[[np.ndarray, "np.ndarray | None", np.random.Generator], np.ndarray]
"""A fixed policy for one group: ``(obs [E, n, ...], action_mask or None, rng) -> actions``,
on NumPy arrays (the collector hands a torch batch's values over on the host, and places the
actions where the batch lives)."""


class FirstUpdate(NamedTuple):
    """When an algorithm can next update: the fewest env steps from now, and what sets them."""

    env_steps: int
    """Env steps (one per env per vector step) to collect before the next update."""
    because: str
    """The settings behind that number, e.g. ``rollout_steps=64 vector steps of 16 envs``."""


@dataclass
class AlgoConfig:
    """Settings shared by every algorithm.

    A subclass declares the range of a numeric setting in its annotation
    (``Annotated[float, Range(gt=0)]``, see :mod:`corral.ranges`); building a
    config with a value outside raises :class:`~corral.errors.ConfigError`.
    """

    gamma: Annotated[float, Range(ge=0, le=1)] = 0.99
    """Discount per decision of an agent."""
    lr: Annotated[float, Range(gt=0)] = 3e-4
    """Adam learning rate."""
    hidden: Annotated[tuple[int, ...], Range(ge=1)] = (64, 64)
    """Hidden layer sizes of every network."""
    seed: Annotated[int, SEED] = 0
    """Seed of network initialisation and exploration."""

    def __post_init__(self) -> None:
        check_ranges(self)

    def replace(self, **changes: Any) -> AlgoConfig:
        """A copy with ``changes`` applied; unknown names raise ``TypeError`` naming them."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise TypeError(
                f"{type(self).__name__} has no setting(s) {unknown}; known: {sorted(known)}"
            )
        return type(self)(**{**asdict(self), **changes})


class Algorithm:
    """Base class of corral's learning algorithms: what the collector and the runner call.

    A split algorithm sets :attr:`policy` and :attr:`learner` in its
    constructor; :meth:`act`, :meth:`learn`, :meth:`state_dict` and
    :meth:`load_state_dict` then delegate to them. An algorithm that is not
    split leaves them ``None`` and implements these methods itself.

    Args:
        venv: the vector env it will act in (for groups, spaces, ``num_envs``).
        config: its config dataclass (``type(self).Config``).
        learn_groups: the groups it acts for and learns; default all.
        device: ``"cpu"``, ``"cuda"`` or ``"auto"``.
    """

    name: ClassVar[str]
    Config: ClassVar[type[AlgoConfig]] = AlgoConfig
    uses_state: ClassVar[bool] = False
    """Whether it reads ``batch.state``: its vector envs are then built with ``state=True``."""
    needs_lockstep: ClassVar[bool] = False
    """Whether every learned agent must act at every step until the episode ends (simultaneous
    moves, no agent leaving early); see :func:`check_env_support`."""
    records_next: ClassVar[bool] = False
    """Whether its rollouts record each step's next observations (``RolloutBuilder``'s
    ``record_next``), from which a replay learner makes its rows."""
    policy: Policy | None = None
    """A split algorithm's policy: acting, with no side effects."""
    learner: Learner | None = None
    """A split algorithm's learner: the optimisers and the counters, learning from rollouts."""

    def __init__(
        self,
        venv: Any,
        config: AlgoConfig | None = None,
        *,
        learn_groups: Collection[str] | None = None,
        device: str = "cpu",
    ) -> None:
        check_env_support(type(self), venv)
        self.config = config if config is not None else self.Config()
        self.groups = {g: venv.groups[g] for g in (learn_groups or venv.groups)}
        self.num_envs = venv.num_envs
        self.observation_space = {g: venv.observation_space(g) for g in self.groups}
        self.action_space = {g: venv.action_space(g) for g in self.groups}
        self.state_space = venv.state_space
        self.device = device

    def act(
        self, batch: Any, *, explore: bool = True, decisions: Mapping[str, Any] | None = None
    ) -> tuple[Actions, Extras]:
        """Actions ``[E, n, ...]`` for its groups, and extras to keep with them.

        ``decisions``: per group ``[E, n]``, each agent's decision index in its episode,
        where it should not come from ``batch.decision``.
        """
        if self.policy is None:
            raise NotImplementedError
        return self.policy.act(batch, explore=explore, decisions=decisions)

    @property
    def rollout_steps(self) -> int:
        """Vector steps per rollout learned from (``config.rollout_steps``)."""
        return int(self.config.rollout_steps)

    def bootstrap_values(
        self, batch: Any, decisions: Mapping[str, Any] | None = None
    ) -> dict[str, Any] | None:
        """A learner with a critic: the value ``[E, n]`` of every agent's observation in ``batch``;
        ``decisions``: each agent's decision index there (as :meth:`act` is given).
        ``None``: its rollouts carry no values (a replay learner's)."""
        return None

    def final_values(
        self, batch: Any, decisions: Mapping[str, Any] | None = None
    ) -> dict[str, Any] | None:
        """A learner with a critic: the value ``[E, n]`` of every agent's next observation after a
        step, which truncated decisions bootstrap from; ``None``: they bootstrap nothing.
        ``decisions``: each agent's decisions in the episode the step continued or ended."""
        return None

    def learn(self, rollouts: Mapping[str, Rollout]) -> dict[str, float]:
        """An update from one :class:`Rollout` per group of :attr:`rollout_steps` vector steps
        (the collector's, at the end of each); returns metrics (an empty dict: none made)."""
        if self.learner is None:
            raise NotImplementedError(f"{type(self).__name__} does not learn from rollouts")
        return self.learner.learn(rollouts)

    def snapshot(self) -> Weights:
        """Its policy's weights as a frozen self-play opponent acts with them (see
        :class:`~corral.algos.selfplay.SnapshotPool`): copies that never change."""
        if self.policy is None:
            raise NotImplementedError(f"{type(self).__name__} has no policy to copy")
        return self.policy.weights()

    def snapshot_clock(self) -> int:
        """What self-play's ``snapshot_interval`` counts: the learner's updates."""
        if self.learner is None:
            raise NotImplementedError(f"{type(self).__name__} has no learner")
        return self.learner.updates

    def first_update(self) -> FirstUpdate | None:
        """A lower bound on the env steps before :meth:`learn` can next update (``None``:
        unknown); the runner warns when a run is too short for any update."""
        return None

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume learning (networks, optimisers, counters)."""
        if self.learner is None:
            raise NotImplementedError
        return self.learner.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if self.learner is None:
            raise NotImplementedError
        self.learner.load_state_dict(state)

    def replay_state_dict(self) -> dict[str, Any] | None:
        """An off-policy learner's replay memory, kept apart from :meth:`state_dict` so that
        only resumable checkpoints carry it; ``None`` for a learner that keeps none."""
        return None

    def load_replay_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`replay_state_dict`."""
        raise NotImplementedError(f"{type(self).__name__} keeps no replay memory to restore")


def check_env_support(algo: type[Algorithm], venv: Any) -> None:
    """Raise :class:`~corral.errors.UnsupportedEnvError` if ``algo`` cannot learn ``venv``'s env.

    The env says how its agents act in ``metadata["lockstep"]`` (see the env
    contract): ``False`` means turn-based or asynchronous moves, or agents
    that leave before the episode ends. An algorithm with ``needs_lockstep``
    refuses such an env here; on an env that does not say, it raises the same
    error at the first step where a learned agent does not act.
    """
    metadata = getattr(venv, "metadata", None) or {}
    if algo.needs_lockstep and metadata.get("lockstep") is False:
        env = f"the env {metadata['name']!r}" if "name" in metadata else "this env"
        raise UnsupportedEnvError(
            f"{algo.__name__} needs every agent to act at every step until the episode ends "
            f"(simultaneous moves, no agent leaving early), but {env} is turn-based, "
            "asynchronous or has agents that leave early (metadata lockstep=False); "
            "MAPPO, IPPO and DQN learn such envs"
        )


def resolve_device(device: str) -> str:
    """``"auto"`` becomes ``"cuda"`` when a GPU is available, else ``"cpu"``."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
