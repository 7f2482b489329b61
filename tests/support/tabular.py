"""A tiny tabular Q-learner (no PyTorch) that the runner's tests train, and how a run's
``config.yaml`` names it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from corral.algos.base import AlgoConfig, Algorithm
from corral.algos.policy import Learner, Policy
from corral.data.rollouts import Rollout, decision_rows
from corral.vector.sampling import sample_array


@dataclass
class TabularConfig(AlgoConfig):
    """Settings of :class:`TabularQ`."""

    lr: float = 0.3
    """Step size of the Q-table updates."""
    epsilon: float = 0.3
    """Exploration rate."""
    states: int = 8
    """Table rows: an observation's state is the argmax of its entries, modulo this."""
    rollout_steps: int = 1
    """Vector steps per rollout."""
    batch: int = 4
    """Rollouts with complete decisions stored before an update."""
    prefer: int = 0
    """The action an untrained table plays greedily."""


class TabularPolicy(Policy):
    """:class:`TabularQ`'s tables, acting epsilon-greedily (or greedily)."""

    def __init__(self, groups: Mapping[str, Any], action_space: Mapping[str, Any], config: Any):
        super().__init__(groups)
        self.config = config
        self.action_space = dict(action_space)
        self.q = {}
        for g in self.groups:
            self.q[g] = np.zeros((config.states, int(self.action_space[g].n)))
            self.q[g][:, config.prefer] = 1e-3
        self.rng = np.random.default_rng(config.seed)

    def state(self, obs: np.ndarray) -> np.ndarray:
        flat = np.asarray(obs).reshape(*np.shape(obs)[:-1], -1)
        return np.argmax(flat, axis=-1) % self.config.states

    def act(self, batch: Any, *, explore: bool = True, decisions: Any = None) -> tuple[dict, dict]:
        actions = {}
        for g in self.groups:
            q = self.q[g][self.state(batch.obs[g])]
            mask = batch.action_mask.get(g)
            best = np.argmax(np.where(mask, q, -np.inf) if mask is not None else q, axis=-1)
            if explore:
                random = sample_array(self.action_space[g], best.shape, self.rng, mask)
                best = np.where(self.rng.random(best.shape) < self.config.epsilon, random, best)
            actions[g] = best
        return actions, {}


class TabularQ(Algorithm):
    """Q-learning on a table per group, from each rollout's decisions; the state of an
    observation is its argmax."""

    name: ClassVar[str] = "tabular"
    Config: ClassVar[type[AlgoConfig]] = TabularConfig
    records_next: ClassVar[bool] = True
    config: TabularConfig
    policy: TabularPolicy

    def __init__(
        self,
        venv: Any,
        config: AlgoConfig | None = None,
        *,
        learn_groups: Any = None,
        device: str = "cpu",
    ) -> None:
        groups = self.describe(venv, config, learn_groups, device)
        Learner.__init__(self, TabularPolicy(groups, self.action_space, self.config))
        self.pending: list[Mapping[str, Any]] = []

    @property
    def q(self) -> dict[str, np.ndarray]:
        return self.policy.q

    def learn(self, rollouts: Mapping[str, Rollout]) -> dict[str, float]:
        fields = ("obs", "action", "reward", "next_obs", "terminated")
        rows = {g: decision_rows(r, fields) for g, r in rollouts.items()}
        complete = {g: t for g, t in rows.items() if len(t["reward"])}
        if complete:
            self.pending.append(complete)
        if len(self.pending) < self.config.batch:
            return {}
        errors = []
        for transitions in self.pending:
            for g, t in transitions.items():
                s, s2 = self.policy.state(t["obs"]), self.policy.state(t["next_obs"])
                bootstrap = np.where(t["terminated"], 0.0, self.policy.q[g][s2].max(axis=-1))
                target = t["reward"] + self.config.gamma * bootstrap
                error = target - self.policy.q[g][s, t["action"]]
                np.add.at(self.policy.q[g], (s, t["action"]), self.config.lr * error)
                errors.extend(error.tolist())
        self.pending.clear()
        self.updates += 1
        return {"loss": float(np.mean(np.square(errors))) if errors else 0.0}

    def state_dict(self) -> dict[str, Any]:
        return {
            "q": {g: q.copy() for g, q in self.policy.q.items()},
            "rng": self.policy.rng.bit_generator.state,
            "pending": list(self.pending),
            "updates": self.updates,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.policy.q = {g: np.array(q) for g, q in state["q"].items()}
        self.policy.rng.bit_generator.state = state["rng"]
        self.pending = list(state["pending"])
        self.updates = int(state["updates"])


TINY = f"{TabularQ.__module__}:TabularQ"
"""How a run's config.yaml names :class:`TabularQ`: reading it back must allow that import."""
