"""Per-agent transitions assembled from vector batches, row by row: the oracle of
:mod:`corral.data.rollouts` (which makes the same decisions as arrays).

An agent's transition runs from a step at which it acted to the next step at
which it must act again, or at which its episode ends. Its reward is the sum
of what it earned in between, and its next observation is its own. This is
what makes turn-based and asynchronous envs correct: in rock-paper-scissors
played turn by turn, the first mover's reward arrives with the second mover's
action and is credited to the first mover's move.

Rewards an agent earns before its first action of an episode have no action
to be credited to and are not part of any transition (they still count in
``Batch.episode_return``).

Usage::

    assembler = TransitionAssembler(venv)
    batch = venv.reset(seed=0)
    while training:
        actions = policy(batch)
        assembler.act(batch, actions, log_prob=..., value=...)
        batch = venv.step(actions)
        for group, t in assembler.observe(batch).items():
            buffer[group].add(t)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

Transitions = dict[str, np.ndarray]
"""Arrays with one row per transition: ``obs``, ``action``, ``reward``,
``next_obs``, ``terminated``, ``truncated``, ``env``, ``agent`` (index in the
group), ``next_acting`` (the agent must act at ``next_obs``), and where the
env has them ``state``, ``next_state``, ``action_mask``, ``next_action_mask``,
plus every extra passed to :meth:`TransitionAssembler.act`."""


class TransitionAssembler:
    """Turns a stream of batches and actions into completed per-agent transitions."""

    def __init__(self, venv: Any) -> None:
        self.num_envs = venv.num_envs
        self.groups = dict(venv.groups)
        self._pending: dict[str, dict[str, np.ndarray]] = {}
        self._is_pending = {
            g: np.zeros((self.num_envs, len(agents)), dtype=bool)
            for g, agents in self.groups.items()
        }
        self._reward = {
            g: np.zeros((self.num_envs, len(agents)), dtype=np.float64)
            for g, agents in self.groups.items()
        }

    def reset(self) -> None:
        """Forget pending actions (call after ``venv.reset()``)."""
        for g in self.groups:
            self._is_pending[g][:] = False
            self._reward[g][:] = 0

    def act(
        self, batch: Any, actions: Mapping[str, np.ndarray], **extras: Mapping[str, Any]
    ) -> None:
        """Record the actions taken by the agents acting in ``batch``.

        ``extras`` are per-group arrays ``[E, n, ...]`` stored with each
        action (a policy's log-probability or value estimate, say); the batch's
        ``decision`` index is stored as ``decision``.
        """
        for g in self.groups:
            acting = batch.acting[g]
            if not acting.any():
                continue
            fields = {"obs": batch.obs[g], "action": np.asarray(actions[g])}
            if batch.state is not None:
                fields["state"] = np.broadcast_to(
                    batch.state[:, None], (*acting.shape, *batch.state.shape[1:])
                )
            if g in batch.action_mask:
                fields["action_mask"] = batch.action_mask[g]
            decision = getattr(batch, "decision", None)  # the vector layer's (tests' may lack it)
            if decision is not None:
                fields["decision"] = np.asarray(decision[g])
            for name, per_group in extras.items():
                if g in per_group:  # groups played by fixed policies carry no extras
                    fields[name] = np.asarray(per_group[g])
            store = self._pending.setdefault(g, {})
            for name, value in fields.items():
                if name not in store:
                    store[name] = np.zeros(value.shape, dtype=value.dtype)
                store[name][acting] = value[acting]
            self._is_pending[g] |= acting
            self._reward[g][acting] = 0

    def observe(self, batch: Any) -> dict[str, Transitions]:
        """Credit ``batch``'s rewards and return the transitions it completes, per group."""
        out: dict[str, Transitions] = {}
        for g in self.groups:
            pending = self._is_pending[g]
            self._reward[g] += np.where(pending, batch.reward[g], 0.0)
            ended = batch.terminated[g] | batch.truncated[g]
            done = batch.done[:, None]
            complete = pending & (ended | batch.acting[g] | done)
            if complete.any():
                out[g] = self._complete(g, batch, complete)
        return out

    def _complete(self, g: str, batch: Any, complete: np.ndarray) -> Transitions:
        env, agent = np.nonzero(complete)
        done = batch.done[env]
        t: Transitions = {name: value[complete].copy() for name, value in self._pending[g].items()}
        t["reward"] = self._reward[g][complete].copy()
        t["next_obs"] = _where_rows(done, batch.final_obs[g][complete], batch.obs[g][complete])
        t["terminated"] = batch.terminated[g][complete].copy()
        # An env that ended without ending this agent cut its episode short.
        t["truncated"] = batch.truncated[g][complete] | (done & ~t["terminated"])
        t["next_acting"] = batch.acting[g][complete] & ~done
        if batch.state is not None:
            t["next_state"] = _where_rows(done, batch.final_state[env], batch.state[env])
        if g in batch.action_mask:
            # The contract gives no mask for a final observation: after an episode's end
            # (where only truncated rows bootstrap) every action counts as legal.
            t["next_action_mask"] = batch.action_mask[g][complete] | done[:, None]
        t["env"], t["agent"] = env, agent
        self._is_pending[g][complete] = False
        self._reward[g][complete] = 0
        return t


def _where_rows(cond: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row ``k`` of ``a`` where ``cond[k]``, else of ``b``."""
    return np.where(cond.reshape(-1, *([1] * (a.ndim - 1))), a, b)
