"""MAPPO's row path: per-agent rows from the transition assembler, GAE row by row, PPO.

The package learns from time-major rollouts (:class:`~corral.training.collector.Collector`,
:class:`~corral.data.rollouts.RolloutBuilder`, ``masked_gae``). This is the path it
replaced, the oracle of differential tests: a :class:`RowCollector` steps a vector env
with an algorithm's actions, assembles each completed decision as a row
(:class:`~oracles.transitions.TransitionAssembler`) and hands the rows to a
:class:`MAPPORows`, which updates a :class:`~corral.algos.mappo.MAPPO`'s policy with
:meth:`MAPPOLearner.ppo <corral.algos.mappo.MAPPOLearner.ppo>` every ``rollout_steps``
vector steps, from row-wise GAE (:func:`~oracles.buffers.gae`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from corral.algos.mappo import MAPPO
from corral.training.collector import Collector, Progress
from oracles.buffers import RolloutBuffer, gae
from oracles.transitions import TransitionAssembler, Transitions


class MAPPORows:
    """Trains ``algo``'s policy from rows: what ``MAPPO.learn`` does from rollouts."""

    def __init__(self, algo: MAPPO) -> None:
        self.algo = algo
        self.buffers = {g: RolloutBuffer() for g in algo.groups}
        self.steps_since_update = 0
        """Vector steps collected since the last update."""

    def collected(self) -> None:
        """Count a vector step collected while learning, for :meth:`ready`."""
        self.steps_since_update += 1

    def observe(self, transitions: Mapping[str, Transitions]) -> None:
        """Store completed transitions (with self-play, only those of the learner's actions)."""
        for g, t in transitions.items():
            if "learner" in t:
                keep = t["learner"].astype(bool)
                t = {name: value[keep] for name, value in t.items()}
            if len(t["reward"]):
                self.buffers[g].add(t)

    def ready(self) -> bool:
        """After ``rollout_steps`` vector steps collected, once some transition completed."""
        collected = any(len(b) for b in self.buffers.values())
        return collected and self.steps_since_update >= self.algo.config.rollout_steps

    def update(self) -> dict[str, float]:
        """PPO epochs over each group's stored rows; metrics are named ``group/metric``."""
        metrics: dict[str, float] = {}
        for g, buffer in self.buffers.items():
            if len(buffer):
                for name, value in self._update_group(g, buffer.data()).items():
                    metrics[f"{g}/{name}"] = value
            buffer.clear()
        self.steps_since_update = 0
        self.algo.updated()
        return metrics

    def advantages(self, g: str, t: Transitions) -> tuple[np.ndarray, np.ndarray]:
        """GAE advantages and value targets of group ``g``'s rows ``t``."""
        cfg, policy = self.algo.config, self.algo.policy
        decision = t.get("decision")
        with torch.no_grad():
            next_in = policy.critic_input(
                g,
                t["next_obs"],
                t.get("next_state"),
                None if decision is None else decision + 1,
                t["agent"],
            )
            next_value = policy.nets[g].value(next_in).cpu().numpy()
        if not cfg.bootstrap_truncated:
            next_value = np.where(t["truncated"], 0.0, next_value)
        return gae(t, t["value"], next_value, cfg.gamma, cfg.gae_lambda)

    def _update_group(self, g: str, t: Transitions) -> dict[str, float]:
        agent, policy = t["agent"], self.algo.policy
        critic_in = policy.critic_input(g, t["obs"], t.get("state"), t.get("decision"), agent)
        advantage, returns = self.advantages(g, t)
        return self.algo.ppo(
            g,
            actor_in=policy.actor_input(g, t["obs"], agent),
            critic_in=critic_in,
            mask=t.get("action_mask"),
            sample=t["sample"],
            old_log_prob=t["log_prob"],
            advantage=advantage,
            returns=returns,
            old_value=t["value"],
        )


class RowCollector(Collector):
    """The collector's acting, with learning from rows: every vector step's completed
    transitions go to ``rows`` (NumPy batches only)."""

    def __init__(
        self,
        venv: Any,
        algo: MAPPO,
        fixed: Mapping[str, Any] | None = None,
        seed: int | None = None,
        **seating: Any,
    ) -> None:
        super().__init__(venv, algo, fixed, seed, **seating)
        self.assembler = TransitionAssembler(venv)
        self.rows = MAPPORows(algo)

    def run(
        self,
        env_steps: int,
        *,
        learn: bool = True,
        on_step: Callable[[int], None] | None = None,
    ) -> Progress:
        """Collect at least ``env_steps`` env steps, updating whenever the rows are ready."""
        if not learn:
            return super().run(env_steps, learn=False, on_step=on_step)
        progress = Progress()
        while progress.env_steps < env_steps:
            actions, extras = self.actions(self.batch, explore=True)
            self.assembler.act(self.batch, actions, **next(iter(extras.values())))
            self.batch = self.venv.step(actions)
            progress.env_steps += self.venv.num_envs
            done = self.assembler.observe(self.batch)
            self.rows.collected()
            own = {g: t for g, t in done.items() if g in self.algo.groups}
            if own:
                self.rows.observe(own)
            if self.rows.ready():
                metrics = self.rows.update()
                progress.updates.append({**metrics, **self.told_learned(self.algo)})
            self._record_episodes(progress)
            if on_step is not None:
                on_step(self.venv.num_envs)
        return progress
