"""What every learning algorithm gives the collector and the runner.

An algorithm is a :class:`~corral.algos.policy.Policy` and a
:class:`~corral.algos.policy.Learner`: an :class:`Algorithm` (MAPPO, IPPO,
DQN, MADDPG) is the learner, built for a vector env together with the policy
it improves. The collector (:mod:`corral.training.collector`) acts with the
policy and feeds the learner time-major rollouts; agents it does not learn are
played by other policies or :data:`FixedPolicy` callables (the policy map,
:mod:`corral.training.policy_map`). Nothing passes calls from one to the
other, and the algorithm never steps an env itself, so one collector and one
runner serve MAPPO, IPPO, MADDPG and DQN alike.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

import numpy as np

from corral.algos.policy import Learner
from corral.errors import ConfigError, UnsupportedEnvError
from corral.settings import SEED, Range, check_ranges

if TYPE_CHECKING:
    from corral.vector.protocols import VecEnv

FixedPolicy = Callable[[np.ndarray, "np.ndarray | None", np.random.Generator], np.ndarray]
"""A fixed policy for one group: ``(obs [E, n, ...], action_mask or None, rng) -> actions``,
on NumPy arrays (the collector hands a torch batch's values over on the host, and places the
actions where the batch lives)."""


@dataclass
class AlgoConfig:
    """Settings shared by every algorithm.

    A subclass declares the range of a numeric setting in its annotation
    (``Annotated[float, Range(gt=0)]``, see :mod:`corral.settings.ranges`); building a
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


class Algorithm(Learner):
    """A learning algorithm: a :class:`~corral.algos.policy.Learner` built for a vector env,
    together with the :class:`~corral.algos.policy.Policy` it improves (:attr:`policy`).

    The collector acts with :attr:`policy` and feeds the learner its rollouts;
    the runner saves and restores the learner. A subclass (MAPPO, IPPO, DQN,
    MADDPG) takes ``(venv, config=None, *, learn_groups=None, device="cpu")``,
    calls :meth:`describe`, builds its policy from what that sets and then
    initialises its learner class with it.
    """

    name: ClassVar[str]
    Config: ClassVar[type[AlgoConfig]] = AlgoConfig
    uses_state: bool = False
    """Whether its critics see the env's global ``state``. On the class: whether it asks for
    it (its vector envs are then built with ``state=True``); on a learner: whether its
    critics read it (not where the vector env has no state, or the config turns it off)."""
    needs_lockstep: ClassVar[bool] = False
    """Whether every learned agent must act at every step until the episode ends (simultaneous
    moves, no agent leaving early); see :func:`check_env_support`."""

    if TYPE_CHECKING:
        # The constructor of every subclass, declared for the checker: this class has none.
        def __init__(
            self,
            venv: VecEnv,
            config: AlgoConfig | None = None,
            *,
            learn_groups: Collection[str] | None = None,
            device: str = "cpu",
        ) -> None: ...

    def describe(
        self,
        venv: VecEnv,
        config: AlgoConfig | None,
        learn_groups: Collection[str] | None,
        device: str,
    ) -> dict[str, tuple[str, ...]]:
        """Check that it can learn ``venv``'s env, and set :attr:`config`, ``num_envs``,
        ``observation_space``, ``action_space`` (per group), ``state_space`` and ``device``;
        returns the groups it learns (``learn_groups``, default all), for its policy."""
        check_env_support(type(self), venv)
        self.config = config if config is not None else self.Config()
        groups = {g: tuple(venv.groups[g]) for g in (learn_groups or venv.groups)}
        self.num_envs = venv.num_envs
        self.observation_space = {g: venv.observation_space(g) for g in groups}
        self.action_space = {g: venv.action_space(g) for g in groups}
        self.state_space = venv.state_space
        self.device = device
        return groups


def check_env_support(algo: type[Algorithm], venv: VecEnv) -> None:
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
    """``"auto"`` becomes ``"cuda"`` when a GPU is available, else ``"cpu"``; a CUDA device
    where torch sees none is a :class:`~corral.errors.ConfigError`."""
    if device == "cpu":
        return device
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(
            f"device={device!r}, but torch sees no CUDA GPU here: use device=cpu, or auto "
            "(a GPU where there is one)"
        )
    return device
