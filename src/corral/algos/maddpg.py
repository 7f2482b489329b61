"""MADDPG: decentralised deterministic actors, centralised critics (Lowe et al., 2017).

Each learned group has one actor, shared by its agents, that sees only the
agent's own observation, and one critic that sees the global information:
the env's ``state`` (or, without one, every learned agent's observation), the
joint action of every learned agent in the env, and which agent of the group
it evaluates. Groups played by fixed policies are part of the environment.

Actions:

* ``Box``: a tanh output scaled to the bounds, plus Gaussian exploration
  noise whose standard deviation decays linearly.
* ``Discrete``: logits (illegal actions masked); exploration samples from
  them, or with a linearly decaying probability ``epsilon`` takes a uniform
  legal action; greedy play takes the argmax; the actor learns through a
  straight-through Gumbel-softmax sample.

The critic sees the other agents' actions normalised (one-hot for
``Discrete``, ``[-1, 1]`` for ``Box``). A ``Box`` critic also takes the
agent's own action as input; a ``Discrete`` critic instead outputs one value
per own action, so that Q is linear in the own (one-hot or relaxed) action
and the straight-through Gumbel-softmax gradient moves the logits toward
actions of higher value. (Fed the own action as input, an MLP's gradient at
a one-hot corner can point anywhere; on ``mdp/two_round_nmdp`` it pointed
the wrong way.)

The env's ``state`` reaches the critics only from a vector env made with
``state=True`` (the runner does so, as ``MADDPG.uses_state``); otherwise the
critics see the observations of all learned agents, as in the paper.

Joint replay: MADDPG is meant for simultaneous-move envs (MPE, matrix
games), where every agent acts at every step. Then each vector step
completes one transition of every learned agent in every env, and these are
stored together as one row of a joint replay memory (all agents'
observations, actions, rewards, next observations). MADDPG learns from
rollouts of ``ceil(train_freq / num_envs)`` vector steps: its learner
writes each rollout's ``T * E`` joint rows into its
:class:`~corral.data.replay.Replay`, which lives where the batches do
(NumPy, or torch on their device with ``array="torch"``), then takes one
gradient step per ``train_freq`` env steps there. Turn-based or
asynchronous envs, and envs whose agents leave before the episode ends, raise
:class:`~corral.errors.UnsupportedEnvError`: when MADDPG is built, for envs
that declare ``metadata["lockstep"] = False`` (see
:func:`~corral.algos.base.check_env_support`), else at the first step where an
agent does not act (on torch batches, at the end of that step's rollout: a
check per step would read the device).

The algorithm is split (see :mod:`corral.algos.policy`): a :class:`MADDPGPolicy`
holds the actors and acts with the exploration (``noise_std``, ``epsilon``)
its learner last set, without side effects; a :class:`MADDPGLearner` holds the
critics, target networks, optimisers, replay memory and learning-rate schedule
and learns from rollouts; :class:`MADDPG` is that learner built for a vector
env together with its policy.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from corral.algos.base import AlgoConfig, Algorithm, resolve_device
from corral.algos.encoders import Encoded, check_setting, encoded_mlp, front, has_image
from corral.algos.lockstep import acted_in_lockstep, check_all_acting
from corral.algos.networks import (
    as_input,
    flat_dim,
    gradient_step,
    masked_logits,
    mlp,
    soft_update,
)
from corral.algos.policy import Actions, Extras, FirstUpdate, Learner, Policy, Weights
from corral.arrays import is_tensor
from corral.arrays.tree import map_tree
from corral.data.replay import Replay, Transitions
from corral.data.rollouts import Rollout
from corral.errors import UnsupportedEnvError
from corral.settings import Range

if TYPE_CHECKING:
    from corral.vector.protocols import Batch, VecEnv


@dataclass
class Config(AlgoConfig):
    """MADDPG settings; ``lr`` is the actors' learning rate."""

    critic_lr: Annotated[float, Range(gt=0)] = 1e-3
    """Adam learning rate of the critics."""
    buffer_size: Annotated[int, Range(ge=1)] = 100_000
    """Capacity of the joint replay memory, in env steps."""
    batch_size: Annotated[int, Range(ge=1)] = 256
    """Env steps sampled per gradient step."""
    learning_starts: Annotated[int, Range(ge=0)] = 1_000
    """Rows (env steps) in the replay memory before the first gradient step (also after a
    resume without the memory: ``checkpoint_replay=false``)."""
    train_freq: Annotated[int, Range(ge=1)] = 16
    """Env steps collected per gradient step (of every group's critic and actor); a rollout
    lasts ``ceil(train_freq / num_envs)`` vector steps."""
    tau: Annotated[float, Range(gt=0, le=1)] = 0.01
    """Polyak factor of the target networks: ``target += tau * (online - target)``."""
    max_grad_norm: Annotated[float, Range(gt=0)] = 1.0
    """Gradient norm clip of every network."""
    noise_std: Annotated[float, Range(ge=0)] = 0.3
    """Initial std of the Gaussian exploration noise of ``Box`` actions, in units of
    half the action range."""
    noise_std_final: Annotated[float, Range(ge=0)] = 0.05
    """The noise std reached after ``explore_decay_steps`` env steps, and kept."""
    epsilon: Annotated[float, Range(ge=0, le=1)] = 0.3
    """Initial probability of a uniform random legal ``Discrete`` action when exploring."""
    epsilon_final: Annotated[float, Range(ge=0, le=1)] = 0.02
    """The probability reached after ``explore_decay_steps`` env steps, and kept."""
    explore_decay_steps: Annotated[int, Range(ge=0)] = 50_000
    """Env steps over which ``noise_std`` and ``epsilon`` decay linearly."""
    lr_decay_steps: Annotated[int, Range(ge=0)] = 0
    """Env steps over which both learning rates fall linearly to ``lr_final_frac`` of their
    initial values, then stay; 0 keeps them constant."""
    lr_final_frac: Annotated[float, Range(ge=0, le=1)] = 0.1
    """The fraction of ``lr`` and ``critic_lr`` reached after ``lr_decay_steps``."""
    temperature: Annotated[float, Range(gt=0)] = 1.0
    """Temperature of the Gumbel-softmax relaxation of ``Discrete`` actions."""
    action_reg: Annotated[float, Range(ge=0)] = 1e-3
    """Weight of the squared pre-activation outputs (logits, pre-tanh) in the actor loss."""
    use_state: bool = True
    """Give the critics the env's ``state`` when the vector env has one (else every
    learned agent's observation)."""
    activation: str = "tanh"
    """Hidden-layer activation of actors and critics: ``tanh`` or ``relu``."""
    critic_own_obs: bool = True
    """Also give each agent's critic input its own observation (an agent-specific global
    state): with one critic shared by a group, it need not pick the agent's part out of
    the global input by its index."""
    encoder: str | Callable[..., Any] = "mlp"
    """What observations go through before the actors' and critics' MLPs (see
    :mod:`corral.algos.encoders`): ``mlp`` (none: flattened), ``cnn`` (images), or
    ``module:attr`` of a factory ``(space) -> nn.Module`` with ``out_dim``. A critic
    encodes each agent's observation with its own encoder of that agent's group."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_setting(self.encoder)


class Critic(nn.Module):
    """A critic behind encoders: :attr:`encoders` (one per group, shared by its agents, and
    ``state`` for an image state) give the features it reads; :attr:`head` maps them, the
    actions and the agent's index to Q."""

    def __init__(self, encoders: Mapping[str, Encoded], head: nn.Module) -> None:
        super().__init__()
        self.encoders = nn.ModuleDict(dict(encoders))
        self.head = head

    def features(self, key: str, x: torch.Tensor) -> torch.Tensor:
        """``x`` ``[..., flat_dim]`` (observations of group ``key``, or ``state``) through its
        encoder, where there is one."""
        return self.encoders[key](x) if key in self.encoders else x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x)


class MADDPGPolicy(Policy):
    """MADDPG's actors, one per group: deterministic actions plus exploration.

    :attr:`noise_std` (``Box``) and :attr:`epsilon` (``Discrete``) are the
    exploration the learner sets after each learn; acting changes nothing but
    the draws of :attr:`rng` (NumPy batches) or :attr:`torch_rng` (torch
    batches). The actors' initial parameters are drawn from torch's default
    generator (:class:`MADDPG` seeds it).
    """

    def __init__(
        self,
        groups: Mapping[str, Sequence[str]],
        observation_space: Mapping[str, spaces.Space],
        action_space: Mapping[str, spaces.Space],
        config: Config,
        *,
        device: str,
    ) -> None:
        super().__init__(groups)
        self.config = config
        self.device = device
        self.observation_space = dict(observation_space)
        self.action_space = {g: _supported(g, space) for g, space in action_space.items()}
        self.sizes = {g: len(agents) for g, agents in self.groups.items()}
        self.act_dims = {g: _action_dim(self.action_space[g]) for g in self.groups}
        self.discrete = {g: isinstance(self.action_space[g], spaces.Discrete) for g in self.groups}
        self.actor = {
            g: encoded_mlp(
                front(config.encoder, self.observation_space[g]),
                flat_dim(self.observation_space[g]),
                self.act_dims[g],
                config.hidden,
                0.01,
                config.activation,
            ).to(device)
            for g in self.groups
        }
        self.noise_std, self.epsilon = exploration_at(config, 0)
        """The ``Box`` noise std and ``Discrete`` random-action probability of exploring acts
        (set by the learner after each learn)."""
        self.rng = np.random.default_rng(config.seed)
        """Exploration draws on NumPy batches."""
        self.torch_rng = torch.Generator(device).manual_seed(config.seed)
        """Exploration draws on torch batches (and the learner's Gumbel draws)."""

    def act(
        self,
        batch: Batch,
        *,
        explore: bool = True,
        decisions: Mapping[str, Any] | None = None,
    ) -> tuple[Actions, Extras]:
        """Every agent's action, with exploration (``explore``) or greedy; raises
        ``UnsupportedEnvError`` if an agent of a NumPy batch is not acting (on torch batches,
        the learner does). Actions of torch batches are tensors on the policy's device."""
        if is_tensor(next(iter(batch.acting.values()))):
            return self._act_on_device(batch, explore), {}
        actions: Actions = {}
        noise_std, epsilon = self.noise_std, self.epsilon
        for g in self.groups:
            check_all_acting("MADDPG", g, self.groups[g], batch.acting[g])
            space = self.action_space[g]
            with torch.no_grad():
                out = self.actor[g](as_input(batch.obs[g], self.observation_space[g], self.device))
            out = out.cpu().numpy()
            if isinstance(space, spaces.Discrete):
                legal = batch.action_mask[g].astype(bool)
                if explore:  # Gumbel-max: a sample of softmax(out), or of uniform logits
                    uniform = self.rng.random(out.shape[:-1]) < epsilon
                    out = np.where(uniform[..., None], 0.0, out)
                    out = out + self.rng.gumbel(size=out.shape)
                actions[g] = np.where(legal, out, -np.inf).argmax(axis=-1) + space.start
            else:
                a = np.tanh(out)
                if explore:
                    a = np.clip(a + noise_std * self.rng.normal(size=a.shape), -1, 1)
                scaled = space.low + (a.reshape(*a.shape[:-1], *space.shape) + 1) / 2 * (
                    space.high - space.low
                )
                actions[g] = np.clip(scaled, space.low, space.high).astype(space.dtype)
        return actions, {}

    def _act_on_device(self, batch: Batch, explore: bool) -> Actions:
        """:meth:`act` on torch batches: drawn with :attr:`torch_rng`, nothing read back."""
        actions: Actions = {}
        noise_std, epsilon = self.noise_std, self.epsilon
        for g in self.groups:
            space = self.action_space[g]
            with torch.no_grad():
                out = self.actor[g](as_input(batch.obs[g], self.observation_space[g], self.device))
                if isinstance(space, spaces.Discrete):
                    legal = batch.action_mask[g].to(self.device).bool()
                    if explore:  # Gumbel-max: a sample of softmax(out), or of uniform logits
                        lead = tuple(out.shape[:-1])
                        uniform = self.rand(lead) < epsilon
                        out = torch.where(uniform[..., None], 0.0, out)
                        out = out - torch.log(-torch.log(self.rand(tuple(out.shape))))
                    out = out.masked_fill(~legal, -torch.inf)
                    actions[g] = out.argmax(-1) + int(space.start)
                else:
                    a = torch.tanh(out)
                    if explore:
                        noise = torch.randn(a.shape, generator=self.torch_rng, device=self.device)
                        a = (a + noise_std * noise).clamp(-1, 1)
                    low, high = _bounds(space, self.device)
                    a = a.reshape(*a.shape[:-1], *space.shape)
                    actions[g] = torch.minimum(
                        torch.maximum(low + (a + 1) / 2 * (high - low), low), high
                    )
        return actions

    def rand(self, shape: tuple[int, ...]) -> torch.Tensor:
        """Uniform draws in ``(0, 1)`` from :attr:`torch_rng`."""
        u = torch.rand(shape, generator=self.torch_rng, device=self.device)
        return u.clamp_min(1e-10)

    def weights(self) -> Weights:
        """Every group's actor (CPU copies), the exploration and the version."""
        actor = {
            g: {name: t.detach().to("cpu", copy=True) for name, t in net.state_dict().items()}
            for g, net in self.actor.items()
        }
        params = {"actor": actor, "noise_std": self.noise_std, "epsilon": self.epsilon}
        return {"version": self.version, "params": params}

    def load_weights(self, weights: Weights) -> None:
        params = weights["params"]
        for g, net in self.actor.items():
            net.load_state_dict(params["actor"][g])
        self.noise_std, self.epsilon = float(params["noise_std"]), float(params["epsilon"])
        self.version = int(weights["version"])


class MADDPGLearner(Learner):
    """MADDPG's gradient steps for a :class:`MADDPGPolicy` from rollouts, through a joint
    replay memory: the critics, the target networks, the optimisers, the learning-rate
    schedule. The critics' initial parameters are drawn from torch's default generator
    (:class:`MADDPG` seeds it).

    Args:
        policy: the actors it improves.
        config: the settings.
        state_space: the vector env's ``state`` space (``None``: it has none); with
            ``use_state`` and a ``Box`` state the critics see it.
    """

    policy: MADDPGPolicy

    def __init__(
        self, policy: MADDPGPolicy, config: Config, state_space: spaces.Space | None
    ) -> None:
        super().__init__(policy)
        self.config = config
        device = policy.device
        sizes, act_dims = policy.sizes, policy.act_dims
        joint_dim = sum(sizes[g] * act_dims[g] for g in policy.groups)
        self._others: dict[str, torch.Tensor] = {}  # [n, joint_dim]: 0 on agent i's own slot
        offset = 0
        for g, n in sizes.items():
            own = torch.eye(n).repeat_interleave(act_dims[g], 1)
            self._others[g] = torch.ones(n, joint_dim, device=device)
            self._others[g][:, offset : offset + own.shape[1]] -= own.to(device)
            offset += own.shape[1]
        self.state_space = state_space
        self.critic_state = (
            state_space if config.use_state and isinstance(state_space, spaces.Box) else None
        )
        """The state space the critics see; ``None``: they see every agent's observation."""
        self.uses_state = self.critic_state is not None
        self.critic: dict[str, nn.Module] = {}
        for g, d in act_dims.items():
            encoders = self._critic_encoders(policy, g)
            dims = {h: _features(encoders.get(h), policy.observation_space[h]) for h in sizes}
            if self.critic_state is not None:
                global_dim = _features(encoders.get("state"), self.critic_state)
            else:
                global_dim = sum(sizes[h] * dims[h] for h in sizes)
            critic_in = global_dim + joint_dim + sizes[g]  # + the agent's index
            if config.critic_own_obs:
                critic_in += dims[g]
            if policy.discrete[g]:  # a value per own action
                head = mlp(critic_in, d, config.hidden, activation=config.activation)
            else:  # the own action as input
                head = mlp(critic_in + d, 1, config.hidden, activation=config.activation)
            self.critic[g] = (Critic(encoders, head) if encoders else head).to(device)
        cfg, actor = config, policy.actor
        self.actor_target = {g: copy.deepcopy(net) for g, net in actor.items()}
        self.critic_target = {g: copy.deepcopy(net) for g, net in self.critic.items()}
        self.actor_opt = {
            g: torch.optim.Adam(net.parameters(), lr=cfg.lr, fused=True) for g, net in actor.items()
        }
        self.critic_opt = {
            g: torch.optim.Adam(net.parameters(), lr=cfg.critic_lr, fused=True)
            for g, net in self.critic.items()
        }
        self._online_params = _parameters(actor, self.critic)
        self._target_params = _parameters(self.actor_target, self.critic_target)
        self.buffer = Replay(cfg.buffer_size, seed=cfg.seed)
        self.stored = 0
        """Rows in the replay memory (every rollout writes ``T * E`` of them)."""
        self.due = 0
        """Env steps learned from and not yet paid for by gradient steps."""

    def _critic_encoders(self, policy: MADDPGPolicy, g: str) -> dict[str, Encoded]:
        """The encoders of group ``g``'s critic by the ``encoder`` setting: one per group whose
        observations it reads (every group's, or with a state only its own where
        ``critic_own_obs``), and ``state`` for the state (``cnn`` reads a vector state as
        it is)."""
        setting = self.config.encoder
        seen = dict(policy.observation_space)
        if self.critic_state is not None:
            seen = {g: seen[g]} if self.config.critic_own_obs else {}
            if setting != "cnn" or has_image(self.critic_state):
                seen["state"] = self.critic_state
        encoded = {key: front(setting, space) for key, space in seen.items()}
        return {key: e for key, e in encoded.items() if e is not None}

    def exploration(self) -> tuple[float, float]:
        """The ``Box`` noise std and ``Discrete`` random-action probability after the env
        steps learned from."""
        return exploration_at(self.config, self.env_steps)

    def lr_scale(self) -> float:
        """The current factor on ``lr`` and ``critic_lr`` (1 without ``lr_decay_steps``)."""
        cfg = self.config
        if cfg.lr_decay_steps <= 0:
            return 1.0
        frac = min(1.0, self.env_steps / cfg.lr_decay_steps)
        return 1.0 - frac * (1.0 - cfg.lr_final_frac)

    def update(self, rollouts: Mapping[str, Rollout]) -> dict[str, float]:
        """Set the policy's exploration, store the rollouts' steps as joint rows (one per env
        step), then one gradient step of every critic and actor per ``train_freq`` env steps
        collected, once ``learning_starts`` and ``batch_size`` rows are stored;
        metrics are read from the device once; ``{}`` when no step was taken. Raises
        ``UnsupportedEnvError`` if an agent of a torch rollout did not act at some step."""
        self.policy.noise_std, self.policy.epsilon = self.exploration()
        row: Transitions = {}
        check = None  # on torch: whether every agent acted (act checked NumPy batches)
        for g, rollout in rollouts.items():
            if is_tensor(rollout.acting):
                everyone = acted_in_lockstep(rollout).all()
                check = everyone if check is None else check & everyone
            row |= self.joint_rows(g, rollout)
        row["reward"] = row[f"{next(iter(self.policy.groups))}/reward"]
        self.buffer.add(row)
        rows = len(row["reward"])
        self.stored = min(self.stored + rows, self.config.buffer_size)
        self.due += rows
        metrics, everyone_acted = _read(self._update() if self.ready() else {}, check)
        if not everyone_acted:
            for g, rollout in rollouts.items():
                for acting in acted_in_lockstep(rollout).cpu().numpy():
                    check_all_acting("MADDPG", g, self.policy.groups[g], acting)
        return metrics

    def joint_rows(self, g: str, rollout: Rollout) -> Transitions:
        """``g``'s part of the joint rows ``[T * E, ...]`` of ``rollout`` (every agent acts at
        every step, so each step completes everyone's decision)."""

        def flat(x: Any) -> Any:
            return map_tree(lambda leaf: leaf.reshape(-1, *leaf.shape[2:]), x)

        space = self.policy.action_space[g]
        row = {
            f"{g}/obs": flat(rollout.obs),
            f"{g}/action": flat(_critic_action(space, rollout.action)),
            f"{g}/reward": flat(rollout.reward),
            f"{g}/next_obs": flat(rollout.next["obs"]),
            f"{g}/terminated": flat(rollout.terminated),
        }
        row[f"{g}/reward"] = _as_float32(row[f"{g}/reward"])
        if self.policy.discrete[g]:
            row[f"{g}/action_mask"] = flat(rollout.action_mask)
            row[f"{g}/next_action_mask"] = flat(rollout.next["action_mask"])
        if self.uses_state:
            row["state"], row["next_state"] = flat(rollout.state), flat(rollout.next["state"])
        return row

    def ready(self) -> bool:
        """Whether ``learning_starts`` and ``batch_size`` rows (one per env step) are stored and
        ``train_freq`` env steps not yet paid for are there."""
        cfg = self.config
        return (
            self.stored >= self.rows_to_start
            and self.stored >= cfg.batch_size
            and self.due >= cfg.train_freq
        )

    @property
    def rows_to_start(self) -> int:
        """The rows stored before learning starts: ``learning_starts`` (rows, not env steps:
        a run resumed without its memory refills it first), at most the memory's size."""
        return min(self.config.learning_starts, self.config.buffer_size)

    def _update(self) -> dict[str, Any]:
        """One gradient step of every critic and actor per ``train_freq`` env steps collected;
        the metrics stay tensors (see :func:`_read`)."""
        cfg = self.config
        steps = self.due // cfg.train_freq
        self.due -= steps * cfg.train_freq
        scale = self.lr_scale()
        for opts, lr in ((self.actor_opt, cfg.lr), (self.critic_opt, cfg.critic_lr)):
            for opt in opts.values():
                for param_group in opt.param_groups:
                    param_group["lr"] = lr * scale
        totals: dict[str, Any] = {}
        for _ in range(steps):
            for name, value in self._gradient_step().items():
                totals[name] = totals.get(name, 0.0) + value / steps
        totals["noise_std"], totals["epsilon"] = self.policy.noise_std, self.policy.epsilon
        totals["lr_scale"] = scale
        return totals

    def _gradient_step(self) -> dict[str, torch.Tensor]:
        cfg = self.config
        data = self.buffer.sample(cfg.batch_size)
        obs = {g: self._obs(data[f"{g}/obs"], g) for g in self.policy.groups}
        next_obs = {g: self._obs(data[f"{g}/next_obs"], g) for g in self.policy.groups}
        actions = {g: self._tensor(data[f"{g}/action"]) for g in self.policy.groups}
        with torch.no_grad():
            next_actions = {
                g: self._target_action(g, next_obs[g], data) for g in self.policy.groups
            }
        joint = torch.cat([a.flatten(1) for a in actions.values()], 1)
        next_joint = torch.cat([a.flatten(1) for a in next_actions.values()], 1)
        metrics: dict[str, torch.Tensor] = {}
        for g in self.policy.groups:
            critic = self.critic[g]
            with torch.no_grad():
                target_critic = self.critic_target[g]
                next_glob, next_own = self._seen(target_critic, data, next_obs, "next_state", g)
                next_q = self._q(g, target_critic, next_glob, next_joint, next_actions[g], next_own)
                bootstrap = 1.0 - self._tensor(data[f"{g}/terminated"]).float()
                target = self._tensor(data[f"{g}/reward"]) + cfg.gamma * bootstrap * next_q
            glob, own_obs = self._seen(critic, data, obs, "state", g)
            q = self._q(g, critic, glob, joint, actions[g], own_obs)
            critic_loss = nn.functional.mse_loss(q, target)
            gradient_step(
                self.critic_opt[g], critic_loss, critic.parameters(), max_norm=cfg.max_grad_norm
            )
            if isinstance(critic, Critic):  # its encoders just stepped: their features anew
                with torch.no_grad():
                    glob, own_obs = self._seen(critic, data, obs, "state", g)

            raw = self.policy.actor[g](obs[g])
            own = self._train_action(g, raw, data)
            actor_loss = -self._q(g, critic, glob, joint, own, own_obs).mean()
            actor_loss = actor_loss + cfg.action_reg * raw.pow(2).mean()
            actor = self.policy.actor[g]
            gradient_step(
                self.actor_opt[g], actor_loss, actor.parameters(), max_norm=cfg.max_grad_norm
            )
            metrics |= {
                f"critic_loss/{g}": critic_loss.detach(),
                f"actor_loss/{g}": actor_loss.detach(),
                f"q/{g}": q.detach().mean(),
            }
        soft_update(self._target_params, self._online_params, cfg.tau)
        return metrics

    def _q(
        self,
        g: str,
        critic: nn.Module,
        glob: torch.Tensor,
        joint: torch.Tensor,
        own: torch.Tensor,
        obs: torch.Tensor,
    ) -> torch.Tensor:
        """Q ``[B, n]`` of each agent of ``g`` (observing ``obs``) taking ``own`` ``[B, n, d]``;
        the others take theirs in ``joint``."""
        b, n = own.shape[:2]
        others = joint.unsqueeze(1) * self._others[g]
        ids = torch.eye(n, device=self.policy.device).expand(b, n, n)
        x = [glob.unsqueeze(1).expand(b, n, -1), others, ids]
        if self.config.critic_own_obs:
            x.append(obs.flatten(2))
        if self.policy.discrete[g]:
            return (critic(torch.cat(x, dim=-1)) * own).sum(-1)
        return critic(torch.cat([*x, own], dim=-1)).squeeze(-1)

    def _target_action(self, g: str, next_obs: torch.Tensor, data: Transitions) -> torch.Tensor:
        raw = self.actor_target[g](next_obs)
        if self.policy.discrete[g]:
            mask = self._tensor(data[f"{g}/next_action_mask"])
            index = masked_logits(raw, mask).argmax(-1)
            return nn.functional.one_hot(index, raw.shape[-1]).float()
        return torch.tanh(raw)

    def _train_action(self, g: str, raw: torch.Tensor, data: Transitions) -> torch.Tensor:
        """The actor's differentiable action: straight-through Gumbel-softmax or tanh."""
        if not self.policy.discrete[g]:
            return torch.tanh(raw)
        raw = masked_logits(raw, self._tensor(data[f"{g}/action_mask"]))
        uniform = torch.rand(raw.shape, generator=self.policy.torch_rng, device=raw.device)
        gumbel = -torch.log(-torch.log(uniform.clamp_min(1e-10)))
        soft = torch.softmax((raw + gumbel) / self.config.temperature, dim=-1)
        hard = nn.functional.one_hot(soft.argmax(-1), raw.shape[-1]).float()
        return hard - soft.detach() + soft

    def _seen(
        self,
        critic: nn.Module,
        data: Transitions,
        obs: Mapping[str, torch.Tensor],
        key: str,
        g: str,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """What group ``g``'s ``critic`` reads besides the actions: the global part ``[B, ...]``
        (the state ``data[key]``, or every agent's observation) and each agent's own
        observation ``[B, n, ...]``, through the critic's encoders where it has them."""

        def features(part: str, x: torch.Tensor) -> torch.Tensor:
            return critic.features(part, x) if isinstance(critic, Critic) else x

        if self.critic_state is not None:
            state = as_input(data[key], self.critic_state, self.policy.device)
            glob = features("state", state)
        else:
            glob = torch.cat([features(h, o).flatten(1) for h, o in obs.items()], dim=1)
        own = features(g, obs[g]) if self.config.critic_own_obs else obs[g]
        return glob, own

    def _obs(self, array: np.ndarray, g: str) -> torch.Tensor:
        return as_input(array, self.policy.observation_space[g], self.policy.device)

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(array, device=self.policy.device)

    # -- checkpoints ------------------------------------------------------------------------------

    def _checkpointed(self) -> dict[str, Mapping[str, Any]]:
        """The networks and optimisers, per group, by their keys in :meth:`state_dict`."""
        return {
            "actor": self.policy.actor,
            "critic": self.critic,
            "actor_target": self.actor_target,
            "critic_target": self.critic_target,
            "actor_opt": self.actor_opt,
            "critic_opt": self.critic_opt,
        }

    def state_dict(self) -> dict[str, Any]:
        """Networks, targets, optimisers, counters, the policy's version and random states
        (the replay memory is in :meth:`replay_state_dict`)."""
        state: dict[str, Any] = {
            key: {g: part.state_dict() for g, part in per_group.items()}
            for key, per_group in self._checkpointed().items()
        }
        return (
            state
            | super().state_dict()
            | {
                "due": self.due,
                "rng": self.policy.rng.bit_generator.state,
                "torch_rng": self.policy.torch_rng.get_state(),
            }
        )

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        for key, per_group in self._checkpointed().items():
            for g, part in per_group.items():
                part.load_state_dict(state[key][g])
        super().load_state_dict(state)
        self.due = int(state["due"])
        self.policy.rng.bit_generator.state = state["rng"]
        self.policy.torch_rng.set_state(state["torch_rng"])
        self.policy.noise_std, self.policy.epsilon = self.exploration()

    def replay_state_dict(self) -> dict[str, Any]:
        """The joint replay memory."""
        return self.buffer.state_dict()

    def load_replay_state_dict(self, state: Mapping[str, Any]) -> None:
        self.buffer.load_state_dict(state)
        self.stored = len(self.buffer)


_Config = Config  # the settings class as a type: in the class body below, Config is its attribute


class MADDPG(MADDPGLearner, Algorithm):
    """Multi-agent DDPG with parameters shared within each group.

    The learner (critics, targets, optimisers, replay memory) of a
    :class:`MADDPGPolicy` (:attr:`policy`, the actors) that it builds for ``venv``'s
    groups ``learn_groups`` (default all), both from one seed.
    """

    name = "maddpg"
    Config = Config
    config: _Config
    uses_state = True
    needs_lockstep = True
    records_next = True
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
        cfg = self.config
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)  # the actors' and the critics' initial parameters
            policy = MADDPGPolicy(
                groups, self.observation_space, self.action_space, cfg, device=self.device
            )
            MADDPGLearner.__init__(self, policy, cfg, self.state_space)

    @property
    def rollout_steps(self) -> int:
        """Vector steps per rollout: ``train_freq`` env steps, rounded up to whole vector steps."""
        return -(-self.config.train_freq // self.num_envs)

    def first_update(self) -> FirstUpdate:
        """Until ``learning_starts``, ``batch_size`` and ``train_freq`` env steps are stored."""
        cfg, learner = self.config, self
        rows = max(
            1,
            learner.rows_to_start - learner.stored,
            cfg.batch_size - learner.stored,
            cfg.train_freq - learner.due,
        )
        because = (
            f"learning_starts={cfg.learning_starts}, batch_size={cfg.batch_size}, "
            f"learning at the end of rollouts of {self.rollout_steps} vector steps"
        )
        return FirstUpdate(_whole_rollouts(rows, self.num_envs, self.rollout_steps), because)


def exploration_at(config: Config, env_steps: int) -> tuple[float, float]:
    """The ``Box`` noise std and ``Discrete`` random-action probability after ``env_steps``
    env steps: linear over ``explore_decay_steps``, then kept."""
    frac = min(1.0, env_steps / max(1, config.explore_decay_steps))
    return (
        config.noise_std + frac * (config.noise_std_final - config.noise_std),
        config.epsilon + frac * (config.epsilon_final - config.epsilon),
    )


ActionSpace = spaces.Discrete | spaces.Box
"""The action spaces MADDPG learns (a ``Box`` with finite bounds)."""


def _action_dim(space: ActionSpace) -> int:
    if isinstance(space, spaces.Discrete):
        return int(space.n)
    return int(np.prod(space.shape))


def _supported(group: str, space: spaces.Space) -> ActionSpace:
    """``space``, if MADDPG learns it; else raises :class:`UnsupportedEnvError`."""
    if isinstance(space, spaces.Discrete):
        return space
    if (
        isinstance(space, spaces.Box)
        and np.isfinite(space.low).all()
        and np.isfinite(space.high).all()
    ):
        return space
    raise UnsupportedEnvError(
        f"MADDPG supports Discrete and bounded Box actions (its actors' tanh output is "
        f"scaled to the Box's bounds); group {group!r} has {space}; MAPPO and IPPO learn "
        "unbounded Box actions"
    )


def _critic_action(space: ActionSpace, action: Any) -> Any:
    """Env actions as the critic sees them, float32: one-hot (``Discrete``) or in ``[-1, 1]``
    (``Box``); NumPy or torch as ``action``."""
    if is_tensor(action):
        if isinstance(space, spaces.Discrete):
            index = (action - int(space.start)).long()
            return nn.functional.one_hot(index, int(space.n)).float()
        low, high = _bounds(space, action.device)
        lead = action.shape[: action.ndim - len(space.shape)]
        scaled = 2 * (action - low) / (high - low) - 1
        return scaled.clamp(-1, 1).reshape(*lead, -1).float()
    if isinstance(space, spaces.Discrete):
        return np.eye(int(space.n))[np.asarray(action) - space.start].astype(np.float32)
    lead = action.shape[: action.ndim - len(space.shape)]
    scaled = 2 * (action - space.low) / (space.high - space.low) - 1
    return np.clip(scaled, -1, 1).reshape(*lead, -1).astype(np.float32)


_BOUNDS: dict[tuple[int, str], tuple[spaces.Box, torch.Tensor, torch.Tensor]] = {}
"""``_bounds``' tensors by space and device: copied to a device once, not in every step."""


def _bounds(space: spaces.Box, device: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """A ``Box``'s ``low`` and ``high`` as float tensors on ``device``."""
    key = (id(space), str(device))
    cached = _BOUNDS.get(key)
    if cached is None or cached[0] is not space:
        low = torch.as_tensor(space.low, dtype=torch.float32, device=device)
        high = torch.as_tensor(space.high, dtype=torch.float32, device=device)
        cached = _BOUNDS[key] = (space, low, high)
    return cached[1], cached[2]


def _as_float32(x: Any) -> Any:
    return x.float() if is_tensor(x) else x.astype(np.float32)


def _read(metrics: Mapping[str, Any], check: torch.Tensor | None) -> tuple[dict[str, float], bool]:
    """``metrics`` (tensors and floats) as floats and ``check`` as a bool (``True`` if
    ``None``), the tensors read from the device in one go."""
    names = [k for k, v in metrics.items() if isinstance(v, torch.Tensor)]
    tensors = [metrics[k].reshape(()).float() for k in names]
    if check is not None:
        tensors.append(check.reshape(()).float())
    values = torch.stack(tensors).tolist() if tensors else []
    out = {k: float(v) for k, v in metrics.items() if not isinstance(v, torch.Tensor)}
    out |= dict(zip(names, values, strict=False))
    return out, check is None or bool(values[-1])


def _whole_rollouts(env_steps: int, num_envs: int, rollout_steps: int) -> int:
    """The env steps of the fewest whole rollouts that take at least ``env_steps``."""
    per_rollout = num_envs * rollout_steps
    return -(-env_steps // per_rollout) * per_rollout


def _parameters(*nets: Mapping[str, nn.Module]) -> list[nn.Parameter]:
    return [p for per_group in nets for net in per_group.values() for p in net.parameters()]


def _features(encoded: Encoded | None, space: spaces.Space) -> int:
    """The width of what ``encoded`` makes of observations in ``space`` (flattened: none)."""
    return flat_dim(space) if encoded is None else encoded.out_dim
