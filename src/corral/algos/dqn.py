"""DQN: independent Q-learners, one Q-network shared by the agents of a group.

Each agent learns from its own decisions (see :func:`corral.data.rollouts.decisions`),
treating the others as part of the env; the agents of a group share one
online network, one target network, one optimiser and one replay memory.
It learns from rollouts of ``ceil(train_freq / num_envs)`` vector steps:
:meth:`DQN.learn` writes each rollout's complete decisions (one row per
decision, made as arrays) into its :class:`~corral.data.replay.Replay`
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
  learned from (counted from the rollouts :meth:`DQN.learn` receives; the
  learner sets the policy's ``epsilon`` once per rollout).
  Illegal actions (``action_mask`` false) are never chosen: the greedy action
  is the best legal one and exploration draws uniformly among legal ones.
* ``gradient_steps`` gradient steps per ``train_freq`` env steps, counted
  from when the replay memories hold ``learning_starts`` transitions, taken
  at the end of each rollout (the env steps not yet paid for carry over).
* ``self_play``: the learner plays one seat of a turn-based game against
  frozen snapshots of itself, a policy map of the run (see
  :mod:`corral.algos.selfplay`); a snapshot (:meth:`DQN.snapshot`, acting
  epsilon-greedily with ``opponent_epsilon``) joins the pool every
  ``snapshot_interval`` gradient steps (:meth:`DQN.snapshot_clock`), and only
  the learner's transitions (the extra ``learner``) are stored. Self-play plays
  NumPy batches only, of envs that declare ``metadata["zero_sum"] = True``.

* ``recurrent``: the Q-network has a GRU after its first layer, each agent
  keeps a memory of its episode, and learning samples chunks of ``bptt``
  consecutive decisions from a :class:`~corral.data.sequence_replay.SequenceReplay`
  (a stream per env and agent), unrolled from their stored hidden states (see
  :mod:`corral.algos.recurrent_q`). Off, the numbers are those without the option.

Only ``Discrete`` action spaces are supported. :meth:`DQN.state_dict` holds
the networks, optimisers, counters (hence the epsilon schedule) and random
generators; the replay memories are saved apart
(:meth:`DQN.replay_state_dict`), in the checkpoints a run resumes from.

The algorithm is split (see :mod:`corral.algos.policy`): a :class:`DQNPolicy`
holds the online networks and acts epsilon-greedily with the ``epsilon`` its
learner last set, without side effects; a :class:`DQNLearner` holds the target
networks, optimisers and replay memories and learns from rollouts; :class:`DQN`
is that learner built for a vector env together with its policy.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from corral.algos.base import AlgoConfig, Algorithm, resolve_device
from corral.algos.encoders import check_setting, encoded_mlp, front
from corral.algos.networks import (
    as_input,
    flat_dim,
    frozen_copy,
    gradient_step,
    masked_logits,
    soft_update,
)
from corral.algos.policy import Actions, Extras, FirstUpdate, Learner, Policy, Weights
from corral.algos.recurrent import RecurrentSettings, advanced, start_hidden
from corral.algos.recurrent_q import RecurrentQNet
from corral.arrays import is_tensor
from corral.arrays.tree import map_tree
from corral.data.replay import Replay, Transitions
from corral.data.rollouts import Rollout, decisions
from corral.data.sequence_replay import SequenceReplay
from corral.errors import UnsupportedEnvError
from corral.settings import Range
from corral.vector.sampling import sample_array

if TYPE_CHECKING:
    from corral.vector.protocols import Batch, VecEnv

STORED = ("obs", "action", "reward", "next_obs", "terminated", "next_action_mask")
"""The transition fields the replay memories keep."""


@dataclass
class QConfig(RecurrentSettings):
    """Settings of the replay Q-learners (DQN, VDN, QMIX)."""

    lr: Annotated[float, Range(gt=0)] = 5e-4
    """Adam learning rate."""
    buffer_size: Annotated[int, Range(ge=1)] = 100_000
    """Replay memory capacity per group, in transitions."""
    batch_size: Annotated[int, Range(ge=1)] = 64
    """Transitions per gradient step (per group); recurrent: chunks of ``bptt`` decisions."""
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
    encoder: str | Callable[..., Any] = "mlp"
    """What observations go through before the Q-network's MLP (see
    :mod:`corral.algos.encoders`): ``mlp`` (none: flattened), ``cnn`` (images), or
    ``module:attr`` of a factory ``(space) -> nn.Module`` with ``out_dim``."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_setting(self.encoder)


@dataclass
class Config(QConfig):
    """DQN settings."""

    self_play: bool = False
    """Play one seat per episode against snapshots of itself (zero-sum games; the runner's
    policy map, see :mod:`corral.algos.selfplay`)."""
    pool_size: Annotated[int, Range(ge=1)] = 10
    """Self-play: the most snapshots kept in the opponent pool."""
    snapshot_interval: Annotated[int, Range(ge=1)] = 1_000
    """Self-play: gradient steps between snapshots added to the pool."""
    random_opponent_prob: Annotated[float, Range(ge=0, le=1)] = 0.0
    """Self-play: probability that an episode's opponent is a uniformly random legal player."""
    opponent_epsilon: Annotated[float, Range(ge=0, le=1)] = 0.0
    """Self-play: exploration rate of the snapshot opponents."""


class DQNPolicy(Policy):
    """DQN's online Q-networks, one per group: epsilon-greedy legal actions of a batch.

    :attr:`epsilon` is the exploration rate the learner sets after each learn;
    acting changes nothing but the draws of :attr:`rng` (NumPy batches) or
    :attr:`torch_rng` (torch batches).
    """

    def __init__(
        self,
        groups: Mapping[str, Sequence[str]],
        observation_space: Mapping[str, spaces.Space],
        action_space: Mapping[str, spaces.Discrete],
        config: QConfig,
        *,
        device: str,
    ) -> None:
        super().__init__(groups)
        self.config = config
        self.device = device
        self.observation_space = dict(observation_space)
        self.action_space = dict(action_space)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            self.q = {g: self._q_net(g, int(space.n)) for g, space in self.action_space.items()}
        self.epsilon = epsilon_at(config, 0)
        """The exploration rate of exploring acts (set by the learner after each learn)."""
        self.rng = np.random.default_rng(config.seed)
        """Exploration draws on NumPy batches."""
        self.torch_rng = torch.Generator(device).manual_seed(config.seed)
        """Exploration draws on torch batches."""
        self.memory: dict[bool, dict[str, torch.Tensor]] = {}
        """Recurrent: per acting mode (``explore``), per group, the hidden states ``[E, n,
        rnn_hidden]`` after each agent's last decision (see :mod:`corral.algos.recurrent_q`)."""

    def input_dim(self, group: str) -> int:
        """The width of ``group``'s network input (see :meth:`q_input`)."""
        return flat_dim(self.observation_space[group])

    def q_input(self, group: str, obs: Any) -> torch.Tensor:
        """The network input ``[..., input_dim]`` of observations ``[..., *obs_shape]``."""
        return as_input(obs, self.observation_space[group], self.device)

    def _q_net(self, group: str, actions: int) -> nn.Module:
        """The Q-network of ``group``: its inputs' (:meth:`q_input`) values of ``actions``
        actions, the observation part through the ``encoder`` setting's front."""
        space = self.observation_space[group]
        encoded = front(self.config.encoder, space)
        cfg = self.config
        net: nn.Module
        if cfg.recurrent:
            net = RecurrentQNet(encoded, self.input_dim(group), actions, cfg.hidden, cfg.rnn_hidden)
        else:
            net = encoded_mlp(encoded, self.input_dim(group), actions, cfg.hidden)
        return net.to(self.device)

    def greedy(self, group: str, obs: Any, mask: Any, net: nn.Module | None = None) -> Any:
        """The best legal action of ``net`` (default: the group's online network) per
        observation ``[..., *obs_shape]`` (a tensor on the network's device for tensor
        observations, else NumPy)."""
        net = self.q[group] if net is None else net
        with torch.no_grad():
            return self._best(group, net(self.q_input(group, obs)), obs, mask)

    def _best(self, group: str, q: torch.Tensor, obs: Any, mask: Any) -> Any:
        """The best legal actions of Q values ``q`` ``[..., A]``, placed as ``obs`` is."""
        if mask is not None:
            q = masked_logits(q, torch.as_tensor(mask, device=self.device))
        best: Any = q.argmax(-1)
        if not is_tensor(obs):
            best = best.cpu().numpy()
        return best + int(self.action_space[group].start)

    def epsilon_greedy(
        self, net: nn.Module, group: str, obs: Any, mask: Any, epsilon: float
    ) -> Any:
        """``net``'s greedy legal actions, each replaced with probability ``epsilon`` by a
        uniformly random legal one (drawn from the policy's generators)."""
        return self._explore(group, self.greedy(group, obs, mask, net), mask, epsilon)

    def _explore(self, group: str, actions: Any, mask: Any, epsilon: float) -> Any:
        """``actions``, each replaced with probability ``epsilon`` by a uniformly random legal
        one; greedy acting (``epsilon`` 0) draws nothing."""
        if epsilon <= 0:
            return actions
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

    def act(
        self,
        batch: Batch,
        *,
        explore: bool = True,
        decisions: Mapping[str, Any] | None = None,
    ) -> tuple[Actions, Extras]:
        """Epsilon-greedy legal actions with :attr:`epsilon` (greedy when ``explore`` is
        false) of every agent of its groups; no extras. Recurrent: the memories advance
        where agents act, and the extra ``hidden`` holds each one's state before the step
        (zero where ``Batch.decision``, or ``decisions``, is 0)."""
        epsilon = self.epsilon if explore else 0.0
        masks = batch.action_mask  # every Discrete group has one
        if self.config.recurrent:
            return self._act_recurrent(batch, explore, epsilon, decisions)
        actions = {
            g: self.epsilon_greedy(self.q[g], g, batch.obs[g], masks[g], epsilon)
            for g in self.groups
        }
        return actions, {}

    @torch.no_grad()
    def _act_recurrent(
        self, batch: Batch, explore: bool, epsilon: float, decisions: Mapping[str, Any] | None
    ) -> tuple[Actions, Extras]:
        if decisions is None:
            decisions = getattr(batch, "decision", None)
        if decisions is None:
            raise ValueError(
                f"recurrent {type(self).__name__} resets each agent's memory at its episode's "
                "start, read from Batch.decision (a VectorEnv's batches have it), but the batch "
                "has none: pass decisions={group: [E, n] indices}"
            )
        memory = self.memory.setdefault(explore, {})
        actions: Actions = {}
        hidden: dict[str, Any] = {}
        for g in self.groups:
            obs, mask = batch.obs[g], batch.action_mask[g]
            net = self.q[g]
            assert isinstance(net, RecurrentQNet)
            h = start_hidden(memory.get(g), decisions[g], net.hidden_size, self.device)
            q, new = net.step(self.q_input(g, obs), h)
            actions[g] = self._explore(g, self._best(g, q, obs, mask), mask, epsilon)
            memory[g] = advanced(batch.acting[g], new, h)
            hidden[g] = h if is_tensor(obs) else h.cpu().numpy()
        return actions, {"hidden": hidden}

    def weights(self) -> Weights:
        """Every group's online network (CPU copies), :attr:`epsilon` and the version."""
        q = {
            g: {name: t.detach().to("cpu", copy=True) for name, t in net.state_dict().items()}
            for g, net in self.q.items()
        }
        return {"version": self.version, "params": {"q": q, "epsilon": self.epsilon}}

    def load_weights(self, weights: Weights) -> None:
        for g, net in self.q.items():
            net.load_state_dict(weights["params"]["q"][g])
        self.epsilon = float(weights["params"]["epsilon"])
        self.version = int(weights["version"])


class DQNLearner(Learner):
    """Double-DQN gradient steps for a :class:`DQNPolicy` from rollouts, through replay.

    It keeps the target networks, optimisers and replay memories (one of each per
    group), :attr:`gradient_step` and the env steps not yet paid for by gradient
    steps. :attr:`~corral.algos.policy.Learner.updates` counts the rollouts learned
    from (each moves :attr:`DQNPolicy.epsilon`), :attr:`gradient_step` the gradient
    steps.
    """

    policy: DQNPolicy

    def __init__(self, policy: DQNPolicy, config: QConfig, *, num_envs: int = 1) -> None:
        super().__init__(policy)
        self.config = config
        self.target = {g: frozen_copy(net) for g, net in policy.q.items()}
        self.optimizer = {g: torch.optim.Adam(self.parameters(g), lr=config.lr) for g in policy.q}
        self.buffer: dict[str, Replay | SequenceReplay] = {}
        """Per group, its replay memory: recurrent, a :class:`SequenceReplay` with a stream per
        env and row of an env step (:meth:`rows_per_env`)."""
        for i, g in enumerate(policy.groups):
            seed = config.seed + 1 + i
            if config.recurrent:
                streams = num_envs * self.rows_per_env(g)
                self.buffer[g] = SequenceReplay(config.buffer_size, streams, seed=seed)
            else:
                self.buffer[g] = Replay(config.buffer_size, seed=seed)
        self.gradient_step = 0
        """Gradient steps taken (each of every group whose memory holds rows)."""
        self.pending_steps = 0
        """Env steps learned from and not yet answered by gradient steps."""
        self._stored_lower: int | None = None  # transitions stored at least (None: unknown)
        self._filled: set[str] = set()  # the groups whose memories hold rows

    def parameters(self, group: str) -> list[nn.Parameter]:
        """What ``group``'s optimiser trains: its online network's parameters."""
        return list(self.policy.q[group].parameters())

    def rows_per_env(self, group: str) -> int:
        """Replay rows of ``group`` per env step: one per agent (its decision)."""
        return len(self.policy.groups[group])

    def update_targets(self) -> None:
        """Move every target network towards its online one by ``tau``."""
        for g, net in self.policy.q.items():
            soft_update(self.target[g].parameters(), net.parameters(), self.config.tau)

    def epsilon(self) -> float:
        """The exploration rate after the env steps learned from."""
        return epsilon_at(self.config, self.env_steps)

    def update(self, rollouts: Mapping[str, Rollout]) -> dict[str, float]:
        """Set the policy's epsilon, store each group's complete decisions of ``rollouts``
        (with self-play, the learner's), then ``gradient_steps`` gradient steps per
        ``train_freq`` env steps since the last ones, once ``learning_starts`` transitions
        are stored. Metrics are named ``metric/group`` and read from the device once; ``{}``
        when no step was taken."""
        cfg = self.config
        self.policy.epsilon = self.epsilon()
        steps, envs = next(iter(rollouts.values())).acting.shape[:2]
        env_steps = int(steps) * int(envs)
        # The memories never shrink: their sizes are read (on torch, from the device) only
        # until they hold enough to learn, and the last size read bounds them from below.
        if self._stored_lower is None:
            self._stored_lower = self.stored()
        if self._stored_lower >= cfg.learning_starts:
            self.pending_steps += env_steps
        for g, rollout in rollouts.items():
            self._store(g, rollout)
        if self._stored_lower < max(1, cfg.learning_starts):
            self._stored_lower = self.stored()
            if self._stored_lower < max(1, cfg.learning_starts):
                return {}
        if self.pending_steps < cfg.train_freq:
            return {}
        return self._gradient_steps()

    def _store(self, g: str, rollout: Rollout) -> None:
        recurrent = self.config.recurrent
        if recurrent:
            check_sequences(type(self).__name__, rollout)
        rows, keep = decisions(rollout, (*STORED, "hidden", "decision") if recurrent else STORED)
        if "learner" in rollout.extras:
            keep = keep & (rollout.extras["learner"] != 0)
        # recurrent: [T, E * n] (a stream per env and agent), else [T * E * n]
        lead = (keep.shape[0], -1) if recurrent else (-1,)
        flat = map_tree(lambda x: x.reshape(*lead, *x.shape[3:]), rows)
        self.buffer[g].add(flat, keep.reshape(lead))

    def _sample(self, g: str) -> Transitions:
        """A batch of ``g``'s replay: ``batch_size`` rows, or recurrent, chunks of ``bptt``."""
        buffer = self.buffer[g]
        if isinstance(buffer, SequenceReplay):
            return buffer.sample(self.config.batch_size, self.config.bptt)
        return buffer.sample(self.config.batch_size)

    def stored(self) -> int:
        """Transitions in the replay memories, all groups together."""
        return sum(len(b) for b in self.buffer.values())

    def _gradient_steps(self) -> dict[str, float]:
        """``gradient_steps`` gradient steps for every ``train_freq`` env steps since the last."""
        cfg = self.config
        rounds = self.pending_steps // cfg.train_freq
        self.pending_steps -= rounds * cfg.train_freq
        metrics: list[tuple[str, torch.Tensor]] = []
        for _ in range(rounds * cfg.gradient_steps):
            for g in self.buffer:
                if self._has_rows(g):
                    for key, value in self._learn(g, self._sample(g)).items():
                        metrics.append((f"{key}/{g}", value))
            self.gradient_step += 1
            if self.gradient_step % cfg.target_update_interval == 0:
                self.update_targets()
        values = torch.stack([v for _, v in metrics]).tolist() if metrics else []  # one read
        grouped: dict[str, list[float]] = {}
        for (key, _), value in zip(metrics, values, strict=True):
            grouped.setdefault(key, []).append(value)
        out = {key: float(np.mean(v)) for key, v in grouped.items()}
        out["epsilon"] = self.policy.epsilon
        return out

    def _has_rows(self, g: str) -> bool:
        """Whether ``g``'s memory holds rows (read from the device only until it does)."""
        if g not in self._filled and len(self.buffer[g]):
            self._filled.add(g)
        return g in self._filled

    def targets(self, group: str, t: Mapping[str, Any]) -> torch.Tensor:
        """The double-DQN targets of transitions ``t`` of ``group``."""
        policy = self.policy
        device = policy.device
        with torch.no_grad():
            next_obs = as_input(t["next_obs"], policy.observation_space[group], device)
            return double_q_target(
                torch.as_tensor(t["reward"], dtype=torch.float32, device=device),
                torch.as_tensor(t["terminated"], dtype=torch.bool, device=device),
                policy.q[group](next_obs),
                self.target[group](next_obs),
                torch.as_tensor(t["next_action_mask"], dtype=torch.bool, device=device),
                self.config.gamma,
            )

    def unrolled(
        self, group: str, t: Transitions
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Recurrent: the online network's Q values of chunks ``t``'s observations and next
        observations (with gradients) and the target network's of the next observations,
        each ``[B, L, actions]``, both networks unrolled from each chunk's stored first
        hidden state."""
        policy = self.policy
        net, target = policy.q[group], self.target[group]
        assert isinstance(net, RecurrentQNet) and isinstance(target, RecurrentQNet)
        x, next_x = policy.q_input(group, t["obs"]), policy.q_input(group, t["next_obs"])
        start = torch.as_tensor(t["hidden"][:, 0], dtype=torch.float32, device=policy.device)
        q_all, next_q = net.sequence(x, next_x, start)
        with torch.no_grad():
            _, next_q_target = target.sequence(x, next_x, start)
        return q_all, next_q, next_q_target

    def sequence_loss(self, group: str, t: Transitions) -> tuple[torch.Tensor, torch.Tensor]:
        """Recurrent: the Huber loss (mean over the valid rows) of chunks ``t`` (``[B, L]``
        per field, as :meth:`SequenceReplay.sample` gives them), the online and the target
        network unrolled from each chunk's stored first hidden state; and the Q values
        ``[B, L]`` of the actions taken."""
        policy, device = self.policy, self.policy.device
        q_all, next_q, next_q_target = self.unrolled(group, t)
        action = torch.as_tensor(t["action"], dtype=torch.long, device=device)
        index = action - int(policy.action_space[group].start)
        q = q_all.gather(-1, index[..., None]).squeeze(-1)
        goal = double_q_target(
            torch.as_tensor(t["reward"], dtype=torch.float32, device=device),
            torch.as_tensor(t["terminated"], dtype=torch.bool, device=device),
            next_q.detach(),
            next_q_target,
            torch.as_tensor(t["next_action_mask"], dtype=torch.bool, device=device),
            self.config.gamma,
        )
        return masked_huber(q, goal, t["valid"], self.config.huber_delta), q

    def _learn(self, group: str, t: Transitions) -> dict[str, torch.Tensor]:
        if self.config.recurrent:
            loss, q = self.sequence_loss(group, t)
            self._step(group, loss)
            return {"loss": loss.detach(), "q": q.detach()[t["valid"]].mean()}
        policy = self.policy
        net = policy.q[group]
        obs = as_input(t["obs"], policy.observation_space[group], policy.device)
        action = t["action"] - int(policy.action_space[group].start)
        index = torch.as_tensor(action, dtype=torch.long, device=policy.device)
        q = net(obs).gather(-1, index[:, None]).squeeze(-1)
        loss = nn.functional.huber_loss(q, self.targets(group, t), delta=self.config.huber_delta)
        self._step(group, loss)
        return {"loss": loss.detach(), "q": q.detach().mean()}

    def _step(self, group: str, loss: torch.Tensor) -> None:
        """One clipped Adam step of ``group``'s parameters down ``loss``."""
        max_norm = self.config.max_grad_norm
        gradient_step(self.optimizer[group], loss, self.parameters(group), max_norm=max_norm)

    def state_dict(self) -> dict[str, Any]:
        """Networks, optimisers, counters (hence epsilon), the policy's version and
        generators (not the replay memories: see :meth:`replay_state_dict`)."""
        return {
            **super().state_dict(),
            "q": {g: net.state_dict() for g, net in self.policy.q.items()},
            "target": {g: net.state_dict() for g, net in self.target.items()},
            "optimizer": {g: opt.state_dict() for g, opt in self.optimizer.items()},
            "gradient_step": self.gradient_step,
            "pending_steps": self.pending_steps,
            "rng": self.policy.rng.bit_generator.state,
            "torch_rng": self.policy.torch_rng.get_state(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        for g, net in self.policy.q.items():
            net.load_state_dict(state["q"][g])
            self.target[g].load_state_dict(state["target"][g])
            self.optimizer[g].load_state_dict(state["optimizer"][g])
        super().load_state_dict(state)
        self.gradient_step = int(state["gradient_step"])
        self.pending_steps = int(state["pending_steps"])
        self.policy.rng.bit_generator.state = state["rng"]
        self.policy.torch_rng.set_state(state["torch_rng"])
        self.policy.epsilon = self.epsilon()

    def replay_state_dict(self) -> dict[str, Any]:
        """Every group's replay memory."""
        return {g: buffer.state_dict() for g, buffer in self.buffer.items()}

    def load_replay_state_dict(self, state: Mapping[str, Any]) -> None:
        for g, buffer in self.buffer.items():
            buffer.load_state_dict(state[g])
        self._stored_lower, self._filled = None, set()


_Config = Config  # the settings class as a type: in the class body below, Config is its attribute


class DQN(DQNLearner, Algorithm):
    """Double DQN with action masks, parameters shared per group.

    The learner of a :class:`DQNPolicy` (:attr:`policy`) that it builds for ``venv``'s
    groups ``learn_groups`` (default all).
    """

    name: ClassVar[str] = "dqn"
    Config: ClassVar[type[AlgoConfig]] = Config
    config: _Config
    records_next: ClassVar[bool] = True
    """Its rollouts record what replay rows need (``RolloutBuilder(record_next=True)``)."""

    def __init__(
        self,
        venv: VecEnv,
        config: _Config | None = None,
        *,
        learn_groups: Collection[str] | None = None,
        device: str = "cpu",
    ) -> None:
        groups = self.describe(venv, config, learn_groups, resolve_device(device))
        discrete = discrete_spaces("DQN", self.action_space)
        policy = DQNPolicy(
            groups, self.observation_space, discrete, self.config, device=self.device
        )
        DQNLearner.__init__(self, policy, self.config, num_envs=self.num_envs)

    @property
    def rollout_steps(self) -> int:
        """Vector steps per rollout: ``train_freq`` env steps, rounded up to whole vector steps."""
        return replay_rollout_steps(self.config, self.num_envs)

    def snapshot(self) -> Weights:
        """The policy's weights, acting epsilon-greedily with ``opponent_epsilon`` (a
        self-play opponent's)."""
        weights = self.policy.weights()
        weights["params"]["epsilon"] = self.config.opponent_epsilon
        return weights

    def snapshot_clock(self) -> int:
        """Self-play's snapshots count gradient steps."""
        return self.gradient_step

    def first_update(self) -> FirstUpdate:
        """Filling to ``learning_starts`` (each env step completes at most one transition per
        agent), then ``train_freq`` env steps, to the end of a rollout."""
        agents = sum(len(members) for members in self.groups.values())
        return replay_first_update(self, self.num_envs, agents)


def discrete_spaces(
    algo: str, action_space: Mapping[str, spaces.Space]
) -> dict[str, spaces.Discrete]:
    """``action_space`` when every group's is ``Discrete``; else
    :class:`~corral.errors.UnsupportedEnvError` naming ``algo`` and the group."""
    discrete = {}
    for g, space in action_space.items():
        if not isinstance(space, spaces.Discrete):
            raise UnsupportedEnvError(
                f"{algo} needs Discrete action spaces, but group {g!r} has {space}; "
                "use MAPPO/IPPO or MADDPG for other action spaces"
            )
        discrete[g] = space
    return discrete


def replay_rollout_steps(config: QConfig, num_envs: int) -> int:
    """Vector steps per rollout of a replay Q-learner: ``train_freq`` env steps, rounded up to
    whole vector steps."""
    return -(-config.train_freq // num_envs)


def replay_first_update(learner: DQNLearner, num_envs: int, rows_per_env_step: int) -> FirstUpdate:
    """A replay Q-learner's first update: filling its memories to ``learning_starts`` rows (at
    most ``rows_per_env_step`` rows per env step), then ``train_freq`` env steps, to the end of
    a rollout."""
    cfg = learner.config
    rollout_steps = replay_rollout_steps(cfg, num_envs)
    fill = max(0, max(1, cfg.learning_starts) - learner.stored())
    pending = max(0, cfg.train_freq - learner.pending_steps)
    vector_steps = -(-fill // (num_envs * rows_per_env_step)) + max(1, -(-pending // num_envs))
    vector_steps = -(-vector_steps // rollout_steps) * rollout_steps
    because = (
        f"learning_starts={cfg.learning_starts} transitions, train_freq={cfg.train_freq}, "
        f"learning at the end of rollouts of {rollout_steps} vector steps"
    )
    return FirstUpdate(vector_steps * num_envs, because)


def check_sequences(algo: str, rollout: Rollout) -> None:
    """A ``ValueError`` unless ``rollout`` holds what a recurrent Q-learner's replay needs: the
    decision indices and the extra ``hidden``."""
    if rollout.decision is None or "hidden" not in rollout.extras:
        raise ValueError(
            f"recurrent {algo} learns from rollouts that record each agent's decision index "
            "(Batch.decision) and the hidden states its policy acted from (the extra 'hidden'): "
            "collect them from a VectorEnv with its policy"
        )


def masked_huber(q: torch.Tensor, target: torch.Tensor, valid: Any, delta: float) -> torch.Tensor:
    """The Huber loss of ``q`` against ``target``, averaged over where ``valid`` is true."""
    valid = torch.as_tensor(valid, dtype=torch.bool, device=q.device)
    loss = nn.functional.huber_loss(q, target, reduction="none", delta=delta)
    return (loss * valid).sum() / valid.sum().clamp(min=1)


def epsilon_at(config: QConfig, env_steps: int) -> float:
    """The exploration rate after ``env_steps`` env steps: linear from ``epsilon_start`` to
    ``epsilon_end`` over ``epsilon_decay_steps``, then kept."""
    progress = min(1.0, env_steps / max(1, config.epsilon_decay_steps))
    return config.epsilon_start + progress * (config.epsilon_end - config.epsilon_start)


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
    bootstrap = double_q_bootstrap(next_q, next_q_target, next_mask)
    return reward + gamma * torch.where(terminated, 0.0, bootstrap)


def double_q_bootstrap(
    next_q: torch.Tensor, next_q_target: torch.Tensor, next_mask: torch.Tensor
) -> torch.Tensor:
    """``next_q_target`` ``[..., A]`` at the argmax of ``next_q`` over the legal actions of
    ``next_mask`` (a row with none counts all as legal): ``[...]``."""
    legal = next_mask | ~next_mask.any(-1, keepdim=True)
    best = masked_logits(next_q, legal).argmax(-1, keepdim=True)
    return next_q_target.gather(-1, best).squeeze(-1)
