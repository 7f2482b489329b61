"""DQN: independent Q-learners, one Q-network shared by the agents of a group.

Each agent learns from its own transitions (see :mod:`corral.data.transitions`),
treating the others as part of the env; the agents of a group share one
online network, one target network, one optimiser and one replay memory.
It learns from rollouts (``learns_from = "rollouts"``) of
``ceil(train_freq / num_envs)`` vector steps: :meth:`DQN.learn` writes each
rollout's complete decisions (:func:`corral.data.rollouts.decisions`, the
assembler's transitions made as arrays) into its :class:`~corral.data.replay.Replay`
memories, which live where the batches do (NumPy, or torch on their device
with ``array="torch"``), then takes its gradient steps there.
Details:

* Double DQN: the target of a transition is
  ``r + gamma * Q_target(s', argmax_a' Q_online(s', a'))`` where ``a'``
  ranges over the legal actions of ``next_action_mask``; a terminated
  transition has no bootstrap, a truncated one bootstraps from its
  ``next_obs`` (the final observation). A row whose next mask allows no
  action counts every action as legal.
* Huber loss, gradient norm clipping, Adam.
* The target network follows the online one every ``target_update_interval``
  gradient steps, by ``target <- tau * online + (1 - tau) * target``
  (``tau = 1``: a hard copy).
* Epsilon-greedy acting with epsilon decaying linearly over the env steps
  learned from (counted from the rollouts :meth:`DQN.learn` receives, so it
  changes once per rollout).
  Illegal actions (``action_mask`` false) are never chosen: the greedy action
  is the best legal one and exploration draws uniformly among legal ones.
* ``gradient_steps`` gradient steps per ``train_freq`` env steps, counted
  from when the replay memories hold ``learning_starts`` transitions, taken
  at the end of each rollout (the env steps not yet paid for carry over).
* ``self_play``: the learner plays one seat of a turn-based game against
  frozen snapshots of itself (see :mod:`corral.algos.selfplay`); only its
  own transitions are stored. Self-play plays NumPy batches only.

Only ``Discrete`` action spaces are supported. :meth:`DQN.state_dict` holds
the networks, optimisers, counters (hence the epsilon schedule), random
generators and the self-play pool; the replay memories are saved apart
(:meth:`DQN.replay_state_dict`), in the checkpoints a run resumes from.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from corral.algos.base import Actions, AlgoConfig, Algorithm, Extras, FirstUpdate, resolve_device
from corral.algos.networks import (
    as_input,
    flat_dim,
    frozen_copy,
    loaded_copy,
    masked_logits,
    mlp,
)
from corral.algos.selfplay import SelfPlay
from corral.arrays import is_tensor
from corral.data.replay import Replay
from corral.data.rollouts import Rollout, decisions
from corral.data.transitions import Transitions
from corral.ranges import Range
from corral.vector.sampling import sample_array

STORED = ("obs", "action", "reward", "next_obs", "terminated", "next_action_mask")
"""The transition fields the replay memories keep."""


@dataclass
class Config(AlgoConfig):
    """DQN settings."""

    lr: Annotated[float, Range(gt=0)] = 5e-4
    """Adam learning rate."""
    buffer_size: Annotated[int, Range(ge=1)] = 100_000
    """Replay memory capacity per group, in transitions."""
    batch_size: Annotated[int, Range(ge=1)] = 64
    """Transitions per gradient step (per group)."""
    learning_starts: Annotated[int, Range(ge=0)] = 500
    """Transitions stored (all groups together) before learning starts."""
    train_freq: Annotated[int, Range(ge=1)] = 4
    """Env steps (one per env per vector step) per round of ``gradient_steps`` gradient steps;
    a rollout lasts ``ceil(train_freq / num_envs)`` vector steps."""
    gradient_steps: Annotated[int, Range(ge=1)] = 1
    """Gradient steps per ``train_freq`` env steps."""
    target_update_interval: Annotated[int, Range(ge=1)] = 250
    """Gradient steps between target network updates."""
    tau: Annotated[float, Range(gt=0, le=1)] = 1.0
    """Target update rate: 1 copies the online network, less makes a Polyak average."""
    epsilon_start: Annotated[float, Range(ge=0, le=1)] = 1.0
    """Exploration rate at the first env step."""
    epsilon_end: Annotated[float, Range(ge=0, le=1)] = 0.05
    """Exploration rate after ``epsilon_decay_steps`` env steps."""
    epsilon_decay_steps: Annotated[int, Range(ge=0)] = 10_000
    """Env steps over which epsilon falls linearly from start to end."""
    huber_delta: Annotated[float, Range(gt=0)] = 1.0
    """TD errors beyond it get a constant gradient; returns noisier than that bias the estimates."""
    max_grad_norm: Annotated[float, Range(gt=0)] = 10.0
    """Gradient norm clipping."""
    self_play: bool = False
    """Play one seat per env and episode against snapshots of itself (turn-based games)."""
    pool_size: Annotated[int, Range(ge=1)] = 10
    """Self-play: the most snapshots kept in the opponent pool."""
    snapshot_interval: Annotated[int, Range(ge=1)] = 1_000
    """Self-play: gradient steps between snapshots added to the pool."""
    random_opponent_prob: Annotated[float, Range(ge=0, le=1)] = 0.0
    """Self-play: probability that an episode's opponent is a uniformly random legal player."""
    opponent_epsilon: Annotated[float, Range(ge=0, le=1)] = 0.0
    """Self-play: exploration rate of the snapshot opponents."""


class DQN(Algorithm):
    """Double DQN with action masks, parameters shared per group, optional self-play."""

    name: ClassVar[str] = "dqn"
    Config: ClassVar[type[AlgoConfig]] = Config
    config: Config
    learns_from: ClassVar[str] = "rollouts"
    records_next: ClassVar[bool] = True
    """Its rollouts record what replay rows need (``RolloutBuilder(record_next=True)``)."""

    def __init__(
        self,
        venv: Any,
        config: Config | None = None,
        *,
        learn_groups: Collection[str] | None = None,
        device: str = "cpu",
    ) -> None:
        super().__init__(venv, config, learn_groups=learn_groups, device=device)
        for g, space in self.action_space.items():
            if not isinstance(space, spaces.Discrete):
                raise ValueError(
                    f"DQN needs Discrete action spaces, but group {g!r} has {space}; "
                    "use MAPPO/IPPO or MADDPG for other action spaces"
                )
        cfg = self.config
        self.device = resolve_device(device)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            self.q = {
                g: mlp(flat_dim(self.observation_space[g]), int(space.n), cfg.hidden).to(
                    self.device
                )
                for g, space in self.action_space.items()
            }
        self.target = {g: frozen_copy(net) for g, net in self.q.items()}
        self.optimizer = {
            g: torch.optim.Adam(net.parameters(), lr=cfg.lr) for g, net in self.q.items()
        }
        self.buffer = {
            g: Replay(cfg.buffer_size, seed=cfg.seed + 1 + i) for i, g in enumerate(self.groups)
        }
        self.rng = np.random.default_rng(cfg.seed)
        self.torch_rng = torch.Generator(self.device).manual_seed(cfg.seed)
        self._stored_lower: int | None = None  # transitions stored at least (None: unknown)
        self._filled: set[str] = set()  # the groups whose memories hold rows
        self.env_steps = 0
        self.gradient_step = 0
        self._pending_steps = 0  # env steps not yet answered by gradient steps
        self.selfplay = (
            SelfPlay(self.groups, cfg.pool_size, cfg.random_opponent_prob, seed=cfg.seed)
            if cfg.self_play
            else None
        )

    # -- acting ----------------------------------------------------------------------

    def epsilon(self) -> float:
        """The exploration rate at the current env step."""
        cfg = self.config
        progress = min(1.0, self.env_steps / max(1, cfg.epsilon_decay_steps))
        return cfg.epsilon_start + progress * (cfg.epsilon_end - cfg.epsilon_start)

    def greedy(self, group: str, obs: Any, mask: Any) -> Any:
        """The online network's best legal action per observation ``[..., *obs_shape]`` (a
        tensor on the network's device for tensor observations, else NumPy)."""
        return self._greedy(self.q[group], group, obs, mask)

    def _greedy(self, net: nn.Module, group: str, obs: Any, mask: Any) -> Any:
        with torch.no_grad():
            q = net(as_input(obs, self.observation_space[group], self.device))
            if mask is not None:
                q = masked_logits(q, torch.as_tensor(mask, device=self.device))
            best = q.argmax(-1)
        if not is_tensor(obs):
            best = best.cpu().numpy()
        return best + int(self.action_space[group].start)

    def _epsilon_greedy(
        self, net: nn.Module, group: str, obs: Any, mask: Any, epsilon: float
    ) -> Any:
        actions = self._greedy(net, group, obs, mask)
        if is_tensor(mask):  # drawn on the device, nothing read back
            lead = tuple(mask.shape[:-1])
            explore = torch.rand(lead, generator=self.torch_rng, device=self.device) < epsilon
            scores = torch.rand(tuple(mask.shape), generator=self.torch_rng, device=self.device)
            random = masked_logits(scores, mask.to(self.device)).argmax(-1)
            random = random + int(self.action_space[group].start)
            return torch.where(explore, random, actions)
        explore = self.rng.random(mask.shape[:-1]) < epsilon
        if explore.any():
            random = sample_array(self.action_space[group], mask.shape[:-1], self.rng, mask)
            actions = np.where(explore, random, actions)
        return actions

    def act(self, batch: Any, *, explore: bool = True) -> tuple[Actions, Extras]:
        """Epsilon-greedy legal actions (greedy when ``explore`` is false) for every agent.

        With self-play, exploring acts give the slots the learner does not play
        the opponent's actions, and the extra ``learner`` marks the learner's
        slots; greedy acts play every slot with the online network.
        """
        if explore and self.selfplay is not None and is_tensor(batch.done):
            raise ValueError(
                "DQN self-play plays NumPy batches: make the vector env with array='numpy'"
            )
        epsilon = self.epsilon() if explore else 0.0
        masks = batch.action_mask  # every Discrete group has one
        actions = {
            g: self._epsilon_greedy(self.q[g], g, batch.obs[g], masks[g], epsilon)
            for g in self.groups
        }
        if self.selfplay is None or not explore:
            return actions, {}
        learner = self.selfplay.merge(batch, actions, functools.partial(self._opponent, batch))
        return actions, {"learner": learner}

    def _opponent(self, batch: Any, snapshot: Any, g: str, envs: np.ndarray) -> np.ndarray:
        """Self-play: the actions of ``snapshot`` (``None``: random legal) for ``g`` in ``envs``."""
        mask = batch.action_mask[g][envs]
        if snapshot is None:
            return sample_array(self.action_space[g], mask.shape[:-1], self.rng, mask)
        eps = self.config.opponent_epsilon
        return self._epsilon_greedy(snapshot[g], g, batch.obs[g][envs], mask, eps)

    # -- learning --------------------------------------------------------------------

    @property
    def rollout_steps(self) -> int:
        """Vector steps per rollout: ``train_freq`` env steps, rounded up to whole vector steps."""
        return -(-self.config.train_freq // self.num_envs)

    def learn(self, rollouts: Mapping[str, Rollout]) -> dict[str, float]:
        """Store each group's complete decisions of ``rollouts`` (with self-play, the
        learner's), then ``gradient_steps`` gradient steps per ``train_freq`` env steps since
        the last ones, once ``learning_starts`` transitions are stored. Metrics are named
        ``metric/group`` and read from the device once; ``{}`` when no step was taken."""
        cfg = self.config
        env_steps = next(iter(rollouts.values())).steps * self.num_envs
        self.env_steps += env_steps
        # The memories never shrink: their sizes are read (on torch, from the device) only
        # until they hold enough to learn, and the last size read bounds them from below.
        if self._stored_lower is None:
            self._stored_lower = self._stored()
        if self._stored_lower >= cfg.learning_starts:
            self._pending_steps += env_steps
        for g, rollout in rollouts.items():
            self._store(g, rollout)
        if self._stored_lower < max(1, cfg.learning_starts):
            self._stored_lower = self._stored()
            if self._stored_lower < max(1, cfg.learning_starts):
                return {}
        if self._pending_steps < cfg.train_freq:
            return {}
        return self._update()

    def _store(self, g: str, rollout: Rollout) -> None:
        rows, keep = decisions(rollout, STORED)
        if "learner" in rollout.extras:
            keep = keep & (rollout.extras["learner"] != 0)
        flat = {name: x.reshape(-1, *x.shape[3:]) for name, x in rows.items()}
        self.buffer[g].add(flat, keep.reshape(-1))

    def _stored(self) -> int:
        return sum(len(b) for b in self.buffer.values())

    def first_update(self) -> FirstUpdate:
        """Filling to ``learning_starts`` (each env step completes at most one transition per
        agent), then ``train_freq`` env steps, to the end of a rollout."""
        cfg, env_count = self.config, self.num_envs
        agents = sum(len(members) for members in self.groups.values())
        fill = max(0, max(1, cfg.learning_starts) - self._stored())
        pending = max(0, cfg.train_freq - self._pending_steps)
        vector_steps = -(-fill // (env_count * agents)) + max(1, -(-pending // env_count))
        vector_steps = -(-vector_steps // self.rollout_steps) * self.rollout_steps
        because = (
            f"learning_starts={cfg.learning_starts} transitions, train_freq={cfg.train_freq}, "
            f"learning at the end of rollouts of {self.rollout_steps} vector steps"
        )
        return FirstUpdate(vector_steps * env_count, because)

    def _update(self) -> dict[str, float]:
        """``gradient_steps`` gradient steps for every ``train_freq`` env steps since the last."""
        cfg = self.config
        rounds = self._pending_steps // cfg.train_freq
        self._pending_steps -= rounds * cfg.train_freq
        metrics: list[tuple[str, torch.Tensor]] = []
        for _ in range(rounds * cfg.gradient_steps):
            for g, buffer in self.buffer.items():
                if self._has_rows(g):
                    for key, value in self._learn(g, buffer.sample(cfg.batch_size)).items():
                        metrics.append((f"{key}/{g}", value))
            self.gradient_step += 1
            if self.gradient_step % cfg.target_update_interval == 0:
                for g in self.q:
                    _soft_update(self.target[g], self.q[g], cfg.tau)
            if self.selfplay is not None and self.gradient_step % cfg.snapshot_interval == 0:
                self.selfplay.add({g: frozen_copy(net) for g, net in self.q.items()})
        values = torch.stack([v for _, v in metrics]).tolist() if metrics else []  # one read
        grouped: dict[str, list[float]] = {}
        for (key, _), value in zip(metrics, values, strict=True):
            grouped.setdefault(key, []).append(value)
        out = {key: float(np.mean(v)) for key, v in grouped.items()}
        out["epsilon"] = self.epsilon()
        if self.selfplay is not None:
            out["selfplay/pool"] = float(len(self.selfplay.pool))
            returns = self.selfplay.pop_returns()
            if returns:
                out["selfplay/return"] = float(np.mean(returns))
        return out

    def _has_rows(self, g: str) -> bool:
        """Whether ``g``'s memory holds rows (read from the device only until it does)."""
        if g not in self._filled and len(self.buffer[g]):
            self._filled.add(g)
        return g in self._filled

    def targets(self, group: str, t: Mapping[str, np.ndarray]) -> torch.Tensor:
        """The double-DQN targets of transitions ``t`` of ``group``."""
        space = self.observation_space[group]
        with torch.no_grad():
            next_obs = as_input(t["next_obs"], space, self.device)
            return double_q_target(
                torch.as_tensor(t["reward"], dtype=torch.float32, device=self.device),
                torch.as_tensor(t["terminated"], dtype=torch.bool, device=self.device),
                self.q[group](next_obs),
                self.target[group](next_obs),
                torch.as_tensor(t["next_action_mask"], dtype=torch.bool, device=self.device),
                self.config.gamma,
            )

    def _learn(self, group: str, t: Transitions) -> dict[str, torch.Tensor]:
        net = self.q[group]
        obs = as_input(t["obs"], self.observation_space[group], self.device)
        action = t["action"] - int(self.action_space[group].start)
        index = torch.as_tensor(action, dtype=torch.long, device=self.device)
        q = net(obs).gather(-1, index[:, None]).squeeze(-1)
        loss = nn.functional.huber_loss(q, self.targets(group, t), delta=self.config.huber_delta)
        optimizer = self.optimizer[group]
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(net.parameters(), self.config.max_grad_norm)
        optimizer.step()
        return {"loss": loss.detach(), "q": q.detach().mean()}

    # -- checkpoints -------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Networks, optimisers, counters, generators and the self-play pool (not the replay
        memories: see :meth:`replay_state_dict`)."""
        state: dict[str, Any] = {
            "q": {g: net.state_dict() for g, net in self.q.items()},
            "target": {g: net.state_dict() for g, net in self.target.items()},
            "optimizer": {g: opt.state_dict() for g, opt in self.optimizer.items()},
            "env_steps": self.env_steps,
            "gradient_step": self.gradient_step,
            "pending_steps": self._pending_steps,
            "rng": self.rng.bit_generator.state,
            "torch_rng": self.torch_rng.get_state(),
        }
        if self.selfplay is not None:
            state["selfplay"] = self.selfplay.state_dict()
            state["pool"] = [
                {g: net.state_dict() for g, net in s.items()} for s in self.selfplay.pool
            ]
        return state

    def replay_state_dict(self) -> dict[str, Any]:
        """Every group's replay memory."""
        return {g: buffer.state_dict() for g, buffer in self.buffer.items()}

    def load_replay_state_dict(self, state: Mapping[str, Any]) -> None:
        for g, buffer in self.buffer.items():
            buffer.load_state_dict(state[g])
        self._stored_lower, self._filled = None, set()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`; the replay memories are left as they are."""
        for g in self.q:
            self.q[g].load_state_dict(state["q"][g])
            self.target[g].load_state_dict(state["target"][g])
            self.optimizer[g].load_state_dict(state["optimizer"][g])
        self.env_steps = int(state["env_steps"])
        self.gradient_step = int(state["gradient_step"])
        self._pending_steps = int(state["pending_steps"])
        self.rng.bit_generator.state = state["rng"]
        if "torch_rng" in state:  # absent from checkpoints older than torch batches
            self.torch_rng.set_state(state["torch_rng"])
        if self.selfplay is not None:
            self.selfplay.load_state_dict(state["selfplay"])
            self.selfplay.pool = [
                {g: loaded_copy(self.q[g], nets[g]) for g in self.q} for nets in state["pool"]
            ]


def double_q_target(
    reward: torch.Tensor,
    terminated: torch.Tensor,
    next_q: torch.Tensor,
    next_q_target: torch.Tensor,
    next_mask: torch.Tensor,
    gamma: float,
) -> torch.Tensor:
    """``reward + gamma * next_q_target[argmax over legal actions of next_q]``, 0 when terminated.

    ``next_q`` and ``next_q_target`` are the online and target networks'
    values at the next observations ``[B, A]``; ``next_mask`` ``[B, A]`` marks
    the legal next actions (a row with none counts all as legal).
    """
    legal = next_mask | ~next_mask.any(-1, keepdim=True)
    best = masked_logits(next_q, legal).argmax(-1, keepdim=True)
    bootstrap = next_q_target.gather(-1, best).squeeze(-1)
    return reward + gamma * torch.where(terminated, 0.0, bootstrap)


def _soft_update(target: nn.Module, online: nn.Module, tau: float) -> None:
    with torch.no_grad():
        for t, o in zip(target.parameters(), online.parameters(), strict=True):
            t.lerp_(o, tau)
