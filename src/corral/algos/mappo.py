"""MAPPO and IPPO: PPO with one actor and one critic shared by the agents of a group.

MAPPO's critic sees the env's global ``state`` (centralised training,
decentralised execution): build its vector env with ``state=True``. Without a
``state`` (the env has none, or the vector env was built without it) MAPPO's
critic sees the local observations, which makes it IPPO; ``MAPPO.uses_state``
says which. IPPO's critic sees each agent's own observation. Greedy acting
needs observations only. With ``agent_id`` on, every network of a group of
several agents also sees a one-hot of the agent's index in the group, so
agents with different roles (the two seats of a game) can share parameters,
and MAPPO's critic can tell apart the agents it values from one shared state.

Actions: ``Discrete`` spaces get a categorical policy over the legal actions
(``action_mask``); ``Box`` spaces a diagonal Gaussian with a learned,
state-independent log-std, in coordinates where the Box spans ``[-1, 1]``.
The env receives the sample mapped to the Box and clipped to its bounds (the
vector env rejects out-of-bound actions), while log-probabilities are those
of the unclipped sample, as in most PPO implementations.

Decisions are per agent (see :mod:`corral.data.rollouts`), so turn-based
and asynchronous envs need nothing special: :meth:`MAPPO.act` answers for
every agent, the env ignores the agents that are not acting, and each
decision keeps the ``log_prob``, ``value`` and raw ``sample`` it was made
with.

With ``recurrent`` on, the actor and the critic each have a GRU after their
first layer and every agent keeps a memory of its episode, which advances
only where it acts (turn-based and asynchronous envs included); updates use
truncated BPTT over chunks of ``bptt`` decisions (see
:mod:`corral.algos.recurrent`). Off, the networks are MLPs, the same numbers
as before the option existed.

Values are those of the episode's return: a truncated episode (MPE's
``max_cycles``) counts nothing after its end, as the return the runner
reports and Yu et al. do (``bootstrap_truncated`` turns bootstrapping on). A
value then depends on the time left, so the critic also sees how many
decisions the agent has made in its episode (``time_scale``). Without that
input the critic must average over time, and with values bootstrapped past
the episode's end its targets rest mostly on its own extrapolation; either
way it overrates states that agents reach late in an episode, and the
policy learns to reach them: on ``mpe2/simple_spread_v3`` the agents drift
away and the return falls below that of random play.

Self-play (``self_play``, zero-sum games) is a policy map of the run (see
:mod:`corral.algos.selfplay`): the learner plays one seat per episode against
frozen copies of its policy, which sample from their actors; a copy joins the
pool every ``snapshot_interval`` updates, and only the learner's decisions
(the extra ``learner``) are learned from.

The algorithm is split (see :mod:`corral.algos.policy`): a
:class:`MAPPOPolicy` holds the actors and critics and acts without side
effects, a :class:`MAPPOLearner` holds the optimisers and learns from
rollouts, and :class:`MAPPO` is that learner built for a vector env together
with its policy (the collector acts with ``MAPPO(...).policy``).

Defaults follow the MPE settings of Yu et al. 2022, "The Surprising
Effectiveness of PPO in Cooperative Multi-Agent Games" (lr 7e-4, 10 epochs,
one minibatch, clip 0.2, entropy 0.01, GAE lambda 0.95, gradient norm 10,
value normalisation, 64-unit layers); only ``rollout_steps`` (128 vector
steps) differs, set for 8 to 32 envs rather than the paper's 128 threads.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, cast

import numpy as np
import torch
from gymnasium import spaces
from torch import nn
from torch.distributions import Distribution, Independent, Normal

from corral.algos.base import AlgoConfig, Algorithm, resolve_device
from corral.algos.encoders import Encoded, check_setting, encoded_mlp, front, has_image
from corral.algos.networks import (
    as_input,
    flat_dim,
    masked_logits,
    mlp,
    to_device,
)
from corral.algos.policy import Actions, Extras, FirstUpdate, Learner, Policy, Weights
from corral.algos.recurrent import (
    Chunks,
    RecurrentCore,
    RecurrentSettings,
    advanced,
    chunk_rows,
    start_hidden,
)
from corral.algos.row_inputs import RowInputs, StoredRows, minibatches
from corral.arrays import ops_of, to_numpy
from corral.arrays.tree import map_tree
from corral.data.rollouts import Rollout, masked_gae
from corral.errors import UnsupportedEnvError
from corral.settings import Range

if TYPE_CHECKING:
    from corral.vector.protocols import Batch, VecEnv

METRICS = ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_frac")
"""What :meth:`MAPPOLearner.update` reports per group (means over its minibatches)."""


@dataclass
class Config(RecurrentSettings):
    """MAPPO/IPPO settings; the defaults are MAPPO's for MPE (see the module docstring)."""

    lr: Annotated[float, Range(gt=0)] = 7e-4
    """Adam learning rate of actor and critic."""
    lr_decay_steps: Annotated[int, Range(ge=0)] = 0
    """Env steps over which ``lr`` falls linearly to ``lr_final_frac`` of itself, then
    stays; 0 keeps it constant."""
    lr_final_frac: Annotated[float, Range(ge=0, le=1)] = 0.1
    """The fraction of ``lr`` reached after ``lr_decay_steps``."""
    rollout_steps: Annotated[int, Range(ge=1)] = 128
    """Vector steps collected between updates (``rollout_steps * num_envs`` env steps)."""
    epochs: Annotated[int, Range(ge=1)] = 10
    """Passes over the rollout per update."""
    minibatches: Annotated[int, Range(ge=1)] = 1
    """Minibatches per epoch (per group)."""
    clip: Annotated[float, Range(gt=0)] = 0.2
    """PPO ratio clipping range."""
    value_clip: Annotated[float | None, Range(gt=0)] = 0.2
    """Clip the (normalised) value change per update to this range; ``None`` turns it off."""
    vf_coef: Annotated[float, Range(ge=0)] = 1.0
    """Weight of the value loss."""
    ent_coef: Annotated[float, Range(ge=0)] = 0.01
    """Weight of the entropy bonus."""
    gae_lambda: Annotated[float, Range(ge=0, le=1)] = 0.95
    """GAE lambda."""
    max_grad_norm: Annotated[float, Range(gt=0)] = 10.0
    """Gradient norm clipping, applied to actor and critic separately."""
    normalize_advantages: bool = True
    """Standardise advantages over each group's rollout."""
    normalize_values: bool = True
    """Learn values of standardised returns (running mean/std, outputs preserved as in PopArt)."""
    agent_id: bool = True
    """Append a one-hot of the agent's index in its group to every network's input."""
    log_std_init: Annotated[float, Range()] = 0.0
    """Initial log-std of Gaussian policies (in units of half the Box's width)."""
    time_scale: Annotated[float | None, Range(ge=0)] = 1 / 32
    """The critic also sees the agent's decision count in its episode times this; ``None``: not.

    About one over the episode's length in decisions suits.
    """
    bootstrap_truncated: bool = False
    """Bootstrap from the value of a truncated episode's last observation (as for endless tasks)."""
    self_play: bool = False
    """Play one seat per episode against past copies of itself (zero-sum games; the runner's
    policy map, see :mod:`corral.algos.selfplay`)."""
    pool_size: Annotated[int, Range(ge=1)] = 10
    """Self-play: the most past copies kept in the opponent pool."""
    snapshot_interval: Annotated[int, Range(ge=1)] = 5
    """Self-play: updates between copies added to the pool."""
    random_opponent_prob: Annotated[float, Range(ge=0, le=1)] = 0.0
    """Self-play: probability that an episode's opponent is a uniformly random legal player."""
    encoder: str | Callable[..., Any] = "mlp"
    """What observations go through before the actor's and critic's MLPs (see
    :mod:`corral.algos.encoders`): ``mlp`` (none: flattened), ``cnn`` (images), or
    ``module:attr`` of a factory ``(space) -> nn.Module`` with ``out_dim``."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_setting(self.encoder)


class _Categorical:
    """A categorical distribution over the last axis of ``logits``: what PPO reads of one
    (normalised ``logits``, ``probs``, ``log_prob``, ``entropy``), in a few tensor operations."""

    def __init__(self, logits: torch.Tensor) -> None:
        self.logits = torch.log_softmax(logits, dim=-1)

    @property
    def probs(self) -> torch.Tensor:
        return self.logits.exp()

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        return self.logits.gather(-1, value.long().unsqueeze(-1)).squeeze(-1)

    def entropy(self) -> torch.Tensor:
        # masked actions have probability 0 and a finite log-probability: they add 0
        return -(self.logits.exp() * self.logits).sum(-1)


class PolicyHead(nn.Module):
    """A policy over one action space: ``head(x, mask)`` is the distribution of actor
    features ``x``; :meth:`sample` and :meth:`greedy` draw from it (in the head's form, which
    rollouts keep and ``log_prob`` reads), :meth:`to_env` turns those into env actions."""

    def sample(self, dist: Any, generator: torch.Generator) -> torch.Tensor:
        raise NotImplementedError

    def greedy(self, dist: Any) -> torch.Tensor:
        raise NotImplementedError

    def to_env(self, sample: Any) -> Any:
        raise NotImplementedError


class _CategoricalHead(PolicyHead):
    """A categorical policy over a ``Discrete`` space, restricted to legal actions."""

    def __init__(
        self, space: spaces.Discrete, in_dim: int, config: Config, encoded: Encoded | None = None
    ) -> None:
        super().__init__()
        self.start = int(space.start)
        self.net = encoded_mlp(encoded, in_dim, int(space.n), config.hidden, out_gain=0.01)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> _Categorical:
        return _Categorical(masked_logits(self.net(x), mask))

    def sample(self, dist: _Categorical, generator: torch.Generator) -> torch.Tensor:
        """A draw by the Gumbel-max trick, from ``generator``'s stream."""
        u = torch.rand(dist.logits.shape, generator=generator).clamp_(min=1e-20)
        return (dist.logits - to_device(torch.log(-torch.log(u)), dist.logits.device)).argmax(-1)

    def greedy(self, dist: _Categorical) -> torch.Tensor:
        return dist.logits.argmax(-1)

    def to_env(self, sample: Any) -> Any:
        return sample + self.start


class _GaussianHead(PolicyHead):
    """A diagonal Gaussian over a ``Box`` rescaled to ``[-1, 1]`` (unbounded axes unscaled)."""

    centre_t: torch.Tensor
    scale_t: torch.Tensor
    low_t: torch.Tensor
    high_t: torch.Tensor

    def __init__(
        self, space: spaces.Box, in_dim: int, config: Config, encoded: Encoded | None = None
    ) -> None:
        super().__init__()
        self.space = space
        low, high = space.low.reshape(-1), space.high.reshape(-1)
        bounded = np.isfinite(low) & np.isfinite(high)
        # halves first: no inf - inf on unbounded axes, no overflow at a dtype's extremes
        half_low, half_high = np.where(bounded, low / 2, 0.0), np.where(bounded, high / 2, 0.0)
        centre = np.where(bounded, half_low + half_high, 0.0)
        scale = np.where(bounded, half_high - half_low, 1.0)
        self.centre, self.scale = centre.astype(np.float32), scale.astype(np.float32)
        # the same constants for tensors, following the module to its device (not saved)
        for name, value in {
            "centre_t": self.centre,
            "scale_t": self.scale,
            "low_t": low.astype(np.float32),
            "high_t": high.astype(np.float32),
        }.items():
            self.register_buffer(name, torch.as_tensor(value), persistent=False)
        self.dtype = torch.from_numpy(np.empty(0, dtype=space.dtype)).dtype
        self.net = encoded_mlp(encoded, in_dim, len(low), config.hidden, out_gain=0.01)
        self.log_std = nn.Parameter(torch.full((len(low),), float(config.log_std_init)))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> Distribution:
        mean = self.net(x)
        std = self.log_std.exp().expand_as(mean)
        return Independent(Normal(mean, std, validate_args=False), 1, validate_args=False)

    def sample(self, dist: Distribution, generator: torch.Generator) -> torch.Tensor:
        noise = to_device(torch.randn(dist.mean.shape, generator=generator), dist.mean.device)
        return dist.mean + dist.stddev * noise

    def greedy(self, dist: Distribution) -> torch.Tensor:
        return dist.mean

    def to_env(self, sample: Any) -> Any:
        if isinstance(sample, torch.Tensor):
            low, high = self.low_t.to(sample.device), self.high_t.to(sample.device)
            scaled = self.centre_t.to(sample.device) + self.scale_t.to(sample.device) * sample
            action = torch.clamp(scaled, low, high)
            return action.reshape(*sample.shape[:-1], *self.space.shape).to(self.dtype)
        action = np.clip(
            self.centre + self.scale * sample,
            self.space.low.reshape(-1),
            self.space.high.reshape(-1),
        )
        return action.reshape(*sample.shape[:-1], *self.space.shape).astype(self.space.dtype)


@functools.singledispatch
def policy_head(
    space: spaces.Space, in_dim: int, config: Config, encoded: Encoded | None = None
) -> PolicyHead:
    """The policy head for actions in ``space`` of inputs ``[..., in_dim]``, behind the
    encoder ``encoded`` where there is one."""
    raise UnsupportedEnvError(f"MAPPO supports Discrete and Box action spaces, not {space}")


@policy_head.register
def _(
    space: spaces.Discrete, in_dim: int, config: Config, encoded: Encoded | None = None
) -> PolicyHead:
    return _CategoricalHead(space, in_dim, config, encoded)


@policy_head.register
def _(space: spaces.Box, in_dim: int, config: Config, encoded: Encoded | None = None) -> PolicyHead:
    return _GaussianHead(space, in_dim, config, encoded)


class ValueNorm(nn.Module):
    """Running mean and std of returns; :meth:`update` keeps the critic's outputs unchanged.

    When off it is the identity. The statistics cover every return seen.
    """

    mean: torch.Tensor
    var: torch.Tensor
    count: torch.Tensor

    def __init__(self, enabled: bool) -> None:
        super().__init__()
        self.enabled = enabled
        self.register_buffer("mean", torch.zeros((), dtype=torch.float64))
        self.register_buffer("var", torch.ones((), dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    @property
    def std(self) -> torch.Tensor:
        return self.var.sqrt().clamp(min=1e-2)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return ((x - self.mean) / self.std).float() if self.enabled else x

    def denormalize(self, x: torch.Tensor) -> torch.Tensor:
        return (x * self.std + self.mean).float() if self.enabled else x

    @torch.no_grad()
    def update(self, returns: torch.Tensor, out: nn.Linear) -> None:
        """Merge ``returns`` into the statistics and rescale ``out`` (the critic's last layer)."""
        if not self.enabled:
            return
        old_mean, old_std = self.mean.clone(), self.std.clone()
        x = returns.double()
        n, total = len(x), self.count + len(x)
        delta = x.mean() - self.mean
        m2 = self.var * self.count + x.var(unbiased=False) * n + delta**2 * self.count * n / total
        self.mean += delta * n / total
        self.var.copy_(m2 / total)
        self.count.copy_(total)
        out.weight.mul_((old_std / self.std).float())
        out.bias.copy_(((old_std * out.bias + old_mean - self.mean) / self.std).float())


class GroupNets(nn.Module):
    """The actor, critic and value normaliser of one group; ``actor_encoded`` and
    ``critic_encoded``: the encoders in front of their MLPs, where there are."""

    def __init__(
        self,
        actor_in: int,
        critic_in: int,
        action_space: spaces.Space,
        config: Config,
        actor_encoded: Encoded | None = None,
        critic_encoded: Encoded | None = None,
    ):
        super().__init__()
        self.recurrent = config.recurrent
        if config.recurrent:
            # the first layer and a GRU in the cores; the heads' MLPs read the GRU's state
            width, size, heads = config.hidden[0], config.rnn_hidden, config.hidden[1:]
            self.actor_core = RecurrentCore(actor_encoded, actor_in, width, size)
            self.critic_core = RecurrentCore(critic_encoded, critic_in, width, size)
            head_config = cast(Config, config.replace(hidden=heads, recurrent=False))
            self.actor = policy_head(action_space, size, head_config)
            self.critic = mlp(size, 1, heads)
        else:
            self.actor = policy_head(action_space, actor_in, config, actor_encoded)
            self.critic = encoded_mlp(critic_encoded, critic_in, 1, config.hidden)
        self.value_norm = ValueNorm(config.normalize_values)

    def actor_parameters(self) -> list[nn.Parameter]:
        """The actor's parameters (with its recurrent core's)."""
        core = list(self.actor_core.parameters()) if self.recurrent else []
        return core + list(self.actor.parameters())

    def critic_parameters(self) -> list[nn.Parameter]:
        """The critic's parameters (with its recurrent core's)."""
        core = list(self.critic_core.parameters()) if self.recurrent else []
        return core + list(self.critic.parameters())

    def value(self, x: torch.Tensor) -> torch.Tensor:
        """Denormalised value estimates ``[...]`` of critic inputs ``[..., critic_in]``."""
        return self.value_norm.denormalize(self.critic(x).squeeze(-1))

    def head_value(self, features: torch.Tensor) -> torch.Tensor:
        """Recurrent: denormalised values ``[...]`` of the critic core's states ``[..., size]``."""
        return self.value_norm.denormalize(self.critic(features).squeeze(-1))


class MAPPOPolicy(Policy):
    """MAPPO's actors and critics: actions, log-probabilities and values of a batch.

    The critics are part of the policy because values are what a rollout
    records beside the actions (and where a rollout ends, its bootstrap).
    Acting changes nothing but the draws of :attr:`generator` (and, recurrent, the agents'
    :attr:`memory`).
    """

    def __init__(
        self,
        groups: Mapping[str, Sequence[str]],
        observation_space: Mapping[str, spaces.Space],
        action_space: Mapping[str, spaces.Space],
        state_space: spaces.Space | None,
        config: Config,
        *,
        uses_state: bool,
        device: str,
    ) -> None:
        super().__init__(groups)
        self.config = config
        self.device = device
        self.observation_space = dict(observation_space)
        self.action_space = dict(action_space)
        self.state_space = state_space
        self.uses_state = uses_state and state_space is not None
        """Whether the critics see the global state (else each agent's observation)."""
        self.nets: dict[str, GroupNets] = {}
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            for g, agents in self.groups.items():
                ids = len(agents) if config.agent_id and len(agents) > 1 else 0
                actor_in = flat_dim(self.observation_space[g]) + ids
                seen = self.observation_space[g]
                if self.uses_state and state_space is not None:
                    seen = state_space
                critic_in = flat_dim(seen) + (config.time_scale is not None) + ids
                # a vector state behind image observations is flattened
                critic_encoder = "mlp" if config.encoder == "cnn" and not has_image(seen) else None
                nets = GroupNets(
                    actor_in,
                    critic_in,
                    self.action_space[g],
                    config,
                    front(config.encoder, self.observation_space[g]),
                    front(critic_encoder or config.encoder, seen),
                )
                self.nets[g] = nets.to(device)
        # each agent's one-hot id, the rows of an identity (the same numbers as one_hot)
        self._ids = {
            g: torch.eye(len(agents), dtype=torch.float32, device=device)
            for g, agents in self.groups.items()
            if config.agent_id and len(agents) > 1
        }
        self.generator = torch.Generator().manual_seed(config.seed)
        """The policy's random stream (samples; the learner's minibatches draw from it too)."""
        self.memory: dict[bool, dict[str, tuple[torch.Tensor, torch.Tensor]]] = {}
        """Recurrent: per acting mode (``explore``), per group, the actor's and the critic's
        hidden states ``[E, n, rnn_hidden]`` after each agent's last decision (see
        :mod:`corral.algos.recurrent`); acting keeps them, nothing else."""

    # -- inputs ------------------------------------------------------------------

    def _with_id(self, g: str, parts: list[torch.Tensor], agent: Any) -> torch.Tensor:
        """``parts`` concatenated on the last axis, with a one-hot of ``agent`` appended;
        ``None`` means they are ``[E, n, ...]``."""
        ids = self._ids.get(g)
        if ids is not None:
            if agent is None:
                ids = ids.expand(*parts[0].shape[:-2], *ids.shape)
            else:
                ids = ids[torch.as_tensor(agent, device=self.device, dtype=torch.long)]
            parts = [*parts, ids]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)

    def actor_input(
        self, g: str, obs: Any, agent: Any, *, obs_input: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Actor inputs of rows (``agent`` given) or of a batch's ``[E, n]`` agents (``None``).

        ``obs_input``: ``as_input`` of ``obs``, where the caller has it.
        """
        if obs_input is None:
            obs_input = as_input(obs, self.observation_space[g], self.device)
        return self._with_id(g, [obs_input], agent)

    def critic_input(
        self,
        g: str,
        obs: Any,
        state: Any,
        decision: Any,
        agent: Any,
        *,
        obs_input: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Critic inputs of rows (``agent`` given) or of a batch's ``[E, n]`` agents (``None``).

        ``decision`` is each agent's decision index in its episode (ignored without
        ``time_scale``). ``obs_input``: ``as_input`` of ``obs``, where the caller has it.
        """
        if self.uses_state and self.state_space is not None:
            x = as_input(state, self.state_space, self.device)
            if agent is None:
                x = x.unsqueeze(1).expand(-1, len(self.groups[g]), -1)
        elif obs_input is not None:
            x = obs_input
        else:
            x = as_input(obs, self.observation_space[g], self.device)
        return self._with_id(g, [x, *self._time(decision)], agent)

    def _time(self, decision: Any) -> list[torch.Tensor]:
        """The critic's time column ``[..., 1]`` of ``decision`` (none without ``time_scale``)."""
        if self.config.time_scale is None:
            return []
        time = torch.as_tensor(decision, device=self.device, dtype=torch.float32)
        return [(time * self.config.time_scale).unsqueeze(-1)]

    def row_inputs(
        self, g: str, obs: Any, state: Any, decision: Any, agent: Any
    ) -> tuple[RowInputs, RowInputs]:
        """The actor's and the critic's inputs of rows (as :meth:`actor_input` and
        :meth:`critic_input` with ``agent`` given), kept as :class:`RowInputs`: the
        observations (or states) in their stored dtype, one copy where both networks see
        them, made into floats a minibatch at a time."""
        none = torch.zeros(len(agent), 0, device=self.device)
        nets = self.nets[g]
        stored = StoredRows(obs, self.observation_space[g], self.device)
        actor = RowInputs(stored, self._with_id(g, [none], agent), parts=_has_front(nets.actor))
        if self.uses_state and self.state_space is not None:
            stored = StoredRows(state, self.state_space, self.device)
        critic_extra = self._with_id(g, [none, *self._time(decision)], agent)
        critic = RowInputs(stored, critic_extra, parts=_has_front(nets.critic))
        return actor, critic

    def mask(self, mask: Any) -> torch.Tensor | None:
        """An action mask as a boolean tensor on the policy's device (``None`` stays)."""
        return None if mask is None else torch.as_tensor(mask, device=self.device, dtype=torch.bool)

    # -- acting --------------------------------------------------------------------

    @torch.no_grad()
    def act(
        self,
        batch: Batch,
        *,
        explore: bool = True,
        decisions: Mapping[str, Any] | None = None,
    ) -> tuple[Actions, Extras]:
        """Actions of every agent of its groups, sampled (``explore``) or greedy.

        Extras: the raw ``sample`` and its ``log_prob``; when exploring also the
        critic's ``value``, which with ``time_scale`` reads each agent's decision
        index in its episode: ``Batch.decision``, or ``decisions`` where given
        (then returned as the extra ``decision``). With ``recurrent``, also the hidden
        states before each decision, ``actor_hidden`` (and when exploring
        ``critic_hidden``), and the memories advance. Greedy acting uses
        observations only, so it needs no ``Batch.state``. Arrays of the
        batch's place (NumPy, or tensors on its device).
        """
        name = type(self).__name__
        if explore and self.uses_state and batch.state is None:
            raise ValueError(
                f"{name}'s critic needs Batch.state, but the batch has none: "
                "build the vector env with state=True"
            )
        if self.config.recurrent:
            return self._act_recurrent(batch, explore, decisions)
        given = decisions is not None
        if explore and self.config.time_scale is not None:
            decisions = self._decisions(batch, decisions)
        out = _placer(batch.done)
        actions: Actions = {}
        extras: Extras = {"sample": {}, "log_prob": {}}
        for g, nets in self.nets.items():
            obs = batch.obs[g]
            mask = self.mask(batch.action_mask.get(g))
            x = as_input(obs, self.observation_space[g], self.device)
            dist = nets.actor(self.actor_input(g, obs, None, obs_input=x), mask)
            sample = nets.actor.sample(dist, self.generator) if explore else nets.actor.greedy(dist)
            extras["sample"][g] = out(sample)
            extras["log_prob"][g] = out(dist.log_prob(sample))
            actions[g] = nets.actor.to_env(extras["sample"][g])
            if explore:
                decision = None if decisions is None else decisions[g]
                critic_in = self.critic_input(g, obs, batch.state, decision, None, obs_input=x)
                extras.setdefault("value", {})[g] = out(nets.value(critic_in))
                if given:
                    extras.setdefault("decision", {})[g] = decision
        return actions, extras

    def _act_recurrent(
        self, batch: Batch, explore: bool, decisions: Mapping[str, Any] | None
    ) -> tuple[Actions, Extras]:
        """:meth:`act` with memory: each acting agent's hidden states advance, and the ones
        before its decision are the extras ``actor_hidden`` (and ``critic_hidden``)."""
        given = decisions is not None
        indices = self._decisions(batch, decisions)
        out = _placer(batch.done)
        memory = self.memory.setdefault(explore, {})
        size = self.config.rnn_hidden
        actions: Actions = {}
        extras: Extras = {"sample": {}, "log_prob": {}, "actor_hidden": {}}
        for g, nets in self.nets.items():
            obs, acting = batch.obs[g], batch.acting[g]
            previous = memory.get(g, (None, None))
            mask = self.mask(batch.action_mask.get(g))
            x = as_input(obs, self.observation_space[g], self.device)
            actor_h = start_hidden(previous[0], indices[g], size, self.device)
            features = nets.actor_core(self.actor_input(g, obs, None, obs_input=x), actor_h)
            dist = nets.actor(features, mask)
            sample = nets.actor.sample(dist, self.generator) if explore else nets.actor.greedy(dist)
            extras["sample"][g] = out(sample)
            extras["log_prob"][g] = out(dist.log_prob(sample))
            extras["actor_hidden"][g] = out(actor_h)
            actions[g] = nets.actor.to_env(extras["sample"][g])
            critic_h = start_hidden(previous[1], indices[g], size, self.device)
            if explore:
                decision = indices[g] if self.config.time_scale is not None else None
                critic_in = self.critic_input(g, obs, batch.state, decision, None, obs_input=x)
                critic_features = nets.critic_core(critic_in, critic_h)
                extras.setdefault("value", {})[g] = out(nets.head_value(critic_features))
                extras.setdefault("critic_hidden", {})[g] = out(critic_h)
                critic_h = advanced(acting, critic_features, critic_h)
                if given:
                    extras.setdefault("decision", {})[g] = indices[g]
            memory[g] = (advanced(acting, features, actor_h), critic_h)
        return actions, extras

    def _critic_memory(self, g: str, batch: Batch, decisions: Any, *, reset: bool) -> torch.Tensor:
        """The critic's hidden states of ``g`` that exploring reached, zero where an agent has
        not decided in its episode (``reset``: ``decisions[g]`` is 0) or there are none."""
        previous = self.memory.get(True, {}).get(g, (None, None))[1]
        index = decisions[g] if reset else torch.ones(batch.acting[g].shape, dtype=torch.long)
        return start_hidden(previous, index, self.config.rnn_hidden, self.device)

    def _decisions(self, batch: Batch, decisions: Mapping[str, Any] | None) -> Mapping[str, Any]:
        """``decisions`` where given, else the batch's decision indices (``Batch.decision``);
        a ``ValueError`` saying what to pass for a batch without them."""
        if decisions is None:
            decisions = getattr(batch, "decision", None)
        if decisions is None:
            raise ValueError(
                f"{type(self).__name__}'s critic reads each agent's decision index in its "
                "episode (time_scale), but the batch has no Batch.decision (a VectorEnv's "
                "batches have it): pass decisions={group: [E, n] indices}"
            )
        return decisions

    @torch.no_grad()
    def bootstrap_values(
        self, batch: Batch, decisions: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """The value ``[E, n]`` of every agent's observation in ``batch`` at its decision
        index (``Batch.decision``, or ``decisions[g]`` where given); arrays of the batch's
        place."""
        out = _placer(batch.done)
        if self.config.recurrent:
            return self._recurrent_values(batch, batch.obs, batch.state, decisions, reset=True)
        if self.config.time_scale is not None:
            decisions = self._decisions(batch, decisions)
        else:
            decisions = dict.fromkeys(self.nets)
        return {
            g: out(nets.value(self.critic_input(g, batch.obs[g], batch.state, decisions[g], None)))
            for g, nets in self.nets.items()
        }

    @torch.no_grad()
    def final_values(
        self, batch: Batch, decisions: Mapping[str, Any] | None = None
    ) -> dict[str, Any] | None:
        """With ``bootstrap_truncated``, the value ``[E, n]`` of every agent's next observation
        after the step that returned ``batch`` (``final_obs`` in the envs that ended), which
        truncated decisions bootstrap from, at the index a decision there would have: the
        decisions made in the episode the step continued or ended (``Batch.decision``, or
        ``Batch.episode_decisions`` in the envs that ended; ``decisions[g]`` where given).
        ``None`` (bootstrap nothing) without ``bootstrap_truncated``."""
        if not self.config.bootstrap_truncated:
            return None
        done = batch.done
        out = _placer(done)
        if decisions is None and self.config.time_scale is not None:
            indices = self._decisions(batch, None)
            decisions = {
                g: _where_done(done, batch.episode_decisions[g], indices[g]) for g in self.nets
            }
        where_done = functools.partial(_where_done, done)
        obs = {g: map_tree(where_done, batch.final_obs[g], batch.obs[g]) for g in self.nets}
        state = None
        if batch.state is not None:
            state = _where_done(done, batch.final_state, batch.state)
        if self.config.recurrent:
            # the memories of the episodes that ended: not reset before the next act()
            return self._recurrent_values(batch, obs, state, decisions, reset=False)
        values = {}
        for g, nets in self.nets.items():
            decision = None if decisions is None else decisions[g]
            values[g] = out(nets.value(self.critic_input(g, obs[g], state, decision, None)))
        return values

    def _recurrent_values(
        self,
        batch: Batch,
        obs: Mapping[str, Any],
        state: Any,
        decisions: Mapping[str, Any] | None,
        *,
        reset: bool,
    ) -> dict[str, Any]:
        """Values ``[E, n]`` of ``obs`` and ``state`` from the critics' memories (see
        :meth:`_critic_memory`), advancing none."""
        out = _placer(batch.done)
        if reset or (self.config.time_scale is not None and decisions is None):
            decisions = self._decisions(batch, decisions)
        values = {}
        for g, nets in self.nets.items():
            decision = None if decisions is None else decisions[g]
            h = self._critic_memory(g, batch, decisions, reset=reset)
            critic_in = self.critic_input(g, obs[g], state, decision, None)
            values[g] = out(nets.head_value(nets.critic_core(critic_in, h)))
        return values

    # -- weights -------------------------------------------------------------------

    def weights(self) -> Weights:
        """Every group's actor, critic and value normaliser (CPU copies) and the version."""
        params = {
            g: {name: t.detach().to("cpu", copy=True) for name, t in nets.state_dict().items()}
            for g, nets in self.nets.items()
        }
        return {"version": self.version, "params": params}

    def load_weights(self, weights: Weights) -> None:
        for g, nets in self.nets.items():
            nets.load_state_dict(weights["params"][g])
        self.version = int(weights["version"])


class MAPPOLearner(Learner):
    """PPO updates of a :class:`MAPPOPolicy` from rollouts; one Adam optimiser per group.
    :meth:`ppo` learns from any rows of decisions (the tests' row-path oracle uses it too)."""

    policy: MAPPOPolicy

    def __init__(self, policy: MAPPOPolicy, config: Config) -> None:
        super().__init__(policy)
        self.config = config
        self.optimizers: dict[str, torch.optim.Optimizer] = {
            g: torch.optim.Adam(nets.parameters(), lr=config.lr, eps=1e-5, fused=True)
            for g, nets in policy.nets.items()
        }

    def lr_scale(self) -> float:
        """The factor on ``lr`` after the env steps learned from (1 without
        ``lr_decay_steps``)."""
        cfg = self.config
        if cfg.lr_decay_steps <= 0:
            return 1.0
        frac = min(1.0, self.env_steps / cfg.lr_decay_steps)
        return 1.0 - frac * (1.0 - cfg.lr_final_frac)

    def update(self, rollouts: Mapping[str, Rollout]) -> dict[str, float]:
        """PPO epochs over each group's complete decisions in ``rollouts`` (with self-play,
        the learner's) at the learning rate of :meth:`lr_scale`; metrics are named
        ``group/metric``, plus ``lr_scale`` when the learning rate decays."""
        metrics: dict[str, float] = {}
        if self.config.lr_decay_steps > 0:
            scale = metrics["lr_scale"] = self.lr_scale()
            for opt in self.optimizers.values():
                for param_group in opt.param_groups:
                    param_group["lr"] = self.config.lr * scale
        for g, rollout in rollouts.items():
            rows = self.rollout_rows(g, rollout)
            if rows is not None:
                learn = self.ppo_chunks if self.config.recurrent else self.ppo
                learned = learn(g, **rows)
                for name, value in learned.items():
                    metrics[f"{g}/{name}"] = value
        return metrics

    def rollout_rows(self, g: str, rollout: Rollout) -> dict[str, Any] | None:
        """The PPO inputs of ``g``'s decisions to learn from in ``rollout``; ``None``: none."""
        cfg, policy = self.config, self.policy
        advantage, returns, complete = masked_gae(rollout, cfg.gamma, cfg.gae_lambda)
        extras = rollout.extras
        keep = complete & extras["learner"] if "learner" in extras else complete
        # one read of the device for the whole rollout: the decisions' indices, then gathers
        at = ops_of(keep).nonzero(keep)
        step, env, agent = at
        if len(step) == 0:
            return None
        state = None
        if policy.uses_state:
            state = rollout.state[step, env]
            if rollout.carried_state is not None:
                # a decision carried over keeps the state it was made in
                carried = (step == 0) & rollout.carried[env, agent]
                state = _where_done(carried, rollout.carried_state[env, agent], state)
        obs = map_tree(lambda x: x[at], rollout.obs)
        mask = None if rollout.action_mask is None else rollout.action_mask[at]
        decision = rollout.decision if rollout.decision is not None else extras.get("decision")
        decision = None if decision is None else decision[at]
        actor_in: torch.Tensor | RowInputs
        critic_in: torch.Tensor | RowInputs
        seen = [policy.observation_space[g]]
        if policy.uses_state and policy.state_space is not None:
            seen.append(policy.state_space)
        if any(has_image(space) for space in seen) and not cfg.recurrent:
            # images stay in their dtype (uint8), one copy: floats a minibatch at a time
            actor_in, critic_in = policy.row_inputs(g, obs, state, decision, agent)
        else:
            x = as_input(obs, policy.observation_space[g], policy.device)
            actor_in = policy.actor_input(g, obs, agent, obs_input=x)
            critic_in = policy.critic_input(g, obs, state, decision, agent, obs_input=x)
        rows = {
            "actor_in": actor_in,
            "critic_in": critic_in,
            "mask": mask,
            "sample": extras["sample"][at],
            "old_log_prob": extras["log_prob"][at],
            "advantage": advantage[at],
            "returns": returns[at],
            "old_value": rollout.value[at],
        }
        if cfg.recurrent:
            if rollout.decision is None:
                raise ValueError(
                    f"recurrent {type(self).__name__} learns from rollouts that record each "
                    "agent's decision index (Batch.decision): record them from a VectorEnv"
                )
            rows["actor_hidden"] = extras["actor_hidden"][at]
            rows["critic_hidden"] = extras["critic_hidden"][at]
            rows["chunks"] = chunk_rows(
                step,
                env,
                agent,
                rollout.decision[at],
                agents=rollout.acting.shape[2],
                bptt=cfg.bptt,
                device=policy.device,
            )
        return rows

    def ppo(
        self,
        g: str,
        *,
        actor_in: torch.Tensor | RowInputs,
        critic_in: torch.Tensor | RowInputs,
        mask: Any,
        sample: Any,
        old_log_prob: Any,
        advantage: Any,
        returns: Any,
        old_value: Any,
    ) -> dict[str, float]:
        """PPO epochs over one group's decisions (rows), given their advantages and returns;
        the networks' inputs as tensors, or as :class:`RowInputs` made a minibatch at a time."""
        cfg, nets, device = self.config, self.policy.nets[g], self.policy.device
        tensor = functools.partial(torch.as_tensor, device=device, dtype=torch.float32)
        advantage, target, old_value = self._targets(g, advantage, returns, old_value)
        mask = self.policy.mask(mask)
        sample = torch.as_tensor(sample, device=device)
        old_log_prob = tensor(old_log_prob)

        size = -(-len(advantage) // cfg.minibatches)
        rows = [actor_in, critic_in, sample, old_log_prob, advantage, target, old_value]
        if mask is not None:
            rows.append(mask)
        actor_params, critic_params = nets.actor_parameters(), nets.critic_parameters()
        step = SplitStep(self.optimizers[g], actor_params, critic_params, cfg, device)
        history = []
        for _ in range(cfg.epochs):
            perm = torch.randperm(len(advantage), generator=self.policy.generator)
            perm = to_device(perm, device)
            # one gather per epoch: its minibatches are contiguous slices of the shuffled rows
            chunks = perm.split(size)
            shuffled = [minibatches(x, perm, size, chunks) for x in rows]
            for batch in zip(*shuffled, strict=True):
                a_in, c_in, smp, old_lp, adv, tgt, old = batch[:7]
                legal = batch[7] if mask is not None else None
                actor = functools.partial(_actor_loss, cfg, nets, a_in, legal, smp, old_lp, adv)
                critic = functools.partial(_critic_loss, cfg, nets, c_in, tgt, old)
                history.append(step(actor, critic))
        means = torch.stack(history).mean(dim=0).tolist()
        return dict(zip(METRICS, means, strict=True))

    def _targets(
        self, g: str, advantage: Any, returns: Any, old_value: Any
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Advantages (standardised where the config says), and the value targets and old
        values normalised by the value normaliser, which is first updated with ``returns``."""
        cfg, nets = self.config, self.policy.nets[g]
        tensor = functools.partial(torch.as_tensor, device=self.policy.device, dtype=torch.float32)
        advantage, returns, old_value = tensor(advantage), tensor(returns), tensor(old_value)
        nets.value_norm.update(returns, cast(nn.Linear, nets.critic[-1]))
        target, old_value = nets.value_norm.normalize(returns), nets.value_norm.normalize(old_value)
        if cfg.normalize_advantages and len(advantage) > 1:
            advantage = (advantage - advantage.mean()) / (advantage.std() + 1e-8)
        return advantage, target, old_value

    def ppo_inputs(
        self,
        g: str,
        *,
        mask: Any,
        sample: Any,
        old_log_prob: Any,
        advantage: Any,
        returns: Any,
        old_value: Any,
        **rows: Any,
    ) -> dict[str, Any]:
        """Recurrent: the rows of :meth:`rollout_rows` as :meth:`chunk_loss` reads them,
        tensors on the policy's device: the value normaliser updated with ``returns``, values
        normalised (``target``, ``old_value``), advantages standardised."""
        device = self.policy.device
        tensor = functools.partial(torch.as_tensor, device=device, dtype=torch.float32)
        advantage, target, old_value = self._targets(g, advantage, returns, old_value)
        return {
            **rows,
            "actor_hidden": tensor(rows["actor_hidden"]),
            "critic_hidden": tensor(rows["critic_hidden"]),
            "mask": self.policy.mask(mask),
            "sample": torch.as_tensor(sample, device=device),
            "old_log_prob": tensor(old_log_prob),
            "advantage": advantage,
            "target": target,
            "old_value": old_value,
        }

    def chunk_loss(
        self, g: str, rows: Mapping[str, Any], take: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Recurrent: the PPO loss of the chunks ``take`` (indices; default all) of
        :meth:`ppo_inputs`' ``rows``, each unrolled from its first decision's stored hidden
        states, and its statistics (:data:`METRICS`): :meth:`chunk_actor_loss` plus
        :meth:`chunk_critic_loss`."""
        policy, stats = self.chunk_actor_loss(g, rows, take)
        critic, value_loss = self.chunk_critic_loss(g, rows, take)
        return policy + critic, step_stats(stats, value_loss)

    def chunk_actor_loss(
        self, g: str, rows: Mapping[str, Any], take: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Recurrent: the actor's part of :meth:`chunk_loss` (:func:`actor_loss`)."""
        nets = self.policy.nets[g]
        index, valid, first, at = _chunk_rows(rows["chunks"], take)
        actor = nets.actor_core.unroll(rows["actor_in"][index], rows["actor_hidden"][first])
        mask = rows["mask"]
        dist = nets.actor(actor[valid], None if mask is None else mask[at])
        advantage = rows["advantage"][at]
        return actor_loss(
            self.config, dist, rows["sample"][at], rows["old_log_prob"][at], advantage
        )

    def chunk_critic_loss(
        self, g: str, rows: Mapping[str, Any], take: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Recurrent: the critic's part of :meth:`chunk_loss` (:func:`critic_loss`)."""
        nets = self.policy.nets[g]
        index, valid, first, at = _chunk_rows(rows["chunks"], take)
        critic = nets.critic_core.unroll(rows["critic_in"][index], rows["critic_hidden"][first])
        value = nets.critic(critic[valid]).squeeze(-1)
        return critic_loss(self.config, value, rows["target"][at], rows["old_value"][at])

    def ppo_chunks(self, g: str, **rows: Any) -> dict[str, float]:
        """Recurrent: PPO epochs over one group's decisions by truncated BPTT, minibatches of
        whole chunks (see :mod:`corral.algos.recurrent`)."""
        cfg, nets, device = self.config, self.policy.nets[g], self.policy.device
        inputs = self.ppo_inputs(g, **rows)
        chunks: Chunks = inputs["chunks"]
        size = -(-len(chunks) // cfg.minibatches)
        actor_params, critic_params = nets.actor_parameters(), nets.critic_parameters()
        step = SplitStep(self.optimizers[g], actor_params, critic_params, cfg, device)
        history = []
        for _ in range(cfg.epochs):
            perm = torch.randperm(len(chunks), generator=self.policy.generator)
            for take in to_device(perm, device).split(size):
                actor = functools.partial(self.chunk_actor_loss, g, inputs, take)
                critic = functools.partial(self.chunk_critic_loss, g, inputs, take)
                history.append(step(actor, critic))
        means = torch.stack(history).mean(dim=0).tolist()
        return dict(zip(METRICS, means, strict=True))

    def state_dict(self) -> dict[str, Any]:
        """Networks, optimisers, the policy's random stream, counters and version: tensors
        and plain values only, as ``torch.load(weights_only=True)`` reads."""
        return {
            **super().state_dict(),
            "nets": {g: nets.state_dict() for g, nets in self.policy.nets.items()},
            "optimizers": {g: opt.state_dict() for g, opt in self.optimizers.items()},
            "generator": self.policy.generator.get_state(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for g, nets in self.policy.nets.items():
            nets.load_state_dict(state["nets"][g])
            self.optimizers[g].load_state_dict(state["optimizers"][g])
        self.policy.generator.set_state(state["generator"])
        super().load_state_dict(state)


_Config = Config  # the settings class as a type: in the class body below, Config is its attribute


class MAPPO(MAPPOLearner, Algorithm):
    """Multi-agent PPO with a centralised critic on ``state``; see the module docstring.

    The learner of a :class:`MAPPOPolicy` (:attr:`policy`) that it builds for ``venv``'s
    groups ``learn_groups`` (default all).
    """

    name: ClassVar[str] = "mappo"
    Config: ClassVar[type[AlgoConfig]] = Config
    config: _Config
    uses_state: bool = True

    def __init__(
        self,
        venv: VecEnv,
        config: AlgoConfig | None = None,
        *,
        learn_groups: Collection[str] | None = None,
        device: str = "cpu",
    ) -> None:
        groups = self.describe(venv, config, learn_groups, resolve_device(device))
        policy = MAPPOPolicy(
            groups,
            self.observation_space,
            self.action_space,
            self.state_space,
            self.config,
            uses_state=self.uses_state,
            device=self.device,
        )
        self.uses_state = policy.uses_state
        MAPPOLearner.__init__(self, policy, self.config)

    def first_update(self) -> FirstUpdate:
        """A whole rollout: the collector starts one with each run."""
        steps = self.config.rollout_steps
        return FirstUpdate(steps * self.num_envs, f"rollout_steps={steps} of {self.num_envs} envs")


class IPPO(MAPPO):
    """Independent PPO: as :class:`MAPPO`, but each critic sees the agent's own observation."""

    name: ClassVar[str] = "ippo"
    uses_state: bool = False


def step_stats(actor_stats: torch.Tensor, value_loss: torch.Tensor) -> torch.Tensor:
    """A step's statistics in the order of :data:`METRICS`, from :func:`actor_loss`'s and
    :func:`critic_loss`'s."""
    return torch.stack([actor_stats[0], value_loss, *actor_stats[1:]])


def actor_loss(
    cfg: Config,
    dist: Any,
    sample: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantage: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The actor's part of PPO's loss, the clipped policy loss less the entropy bonus, and
    its statistics ``[policy_loss, entropy, approx_kl, clip_frac]`` (no gradient)."""
    log_ratio = dist.log_prob(sample) - old_log_prob
    ratio = log_ratio.exp()
    clipped = ratio.clamp(1 - cfg.clip, 1 + cfg.clip)
    policy_loss = -torch.min(ratio * advantage, clipped * advantage).mean()
    entropy = dist.entropy().mean()
    loss = policy_loss - cfg.ent_coef * entropy
    with torch.no_grad():
        approx_kl = ((ratio - 1) - log_ratio).mean()
        clip_frac = ((ratio - 1).abs() > cfg.clip).float().mean()
        stats = torch.stack([policy_loss, entropy, approx_kl, clip_frac])
    return loss, stats


def critic_loss(
    cfg: Config, value: torch.Tensor, target: torch.Tensor, old_value: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The critic's part of PPO's loss, ``vf_coef`` times the (clipped) value loss, and the
    value loss itself (no gradient)."""
    value_loss = (value - target) ** 2
    if cfg.value_clip is not None:
        value_clipped = old_value + (value - old_value).clamp(-cfg.value_clip, cfg.value_clip)
        value_loss = torch.max(value_loss, (value_clipped - target) ** 2)
    value_loss = 0.5 * value_loss.mean()
    return cfg.vf_coef * value_loss, value_loss.detach()


def _actor_loss(
    cfg: Config,
    nets: GroupNets,
    x: Any,
    mask: Any,
    sample: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantage: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`actor_loss` of a minibatch of rows whose actor inputs are ``x``."""
    return actor_loss(cfg, nets.actor(x, mask), sample, old_log_prob, advantage)


def _critic_loss(
    cfg: Config, nets: GroupNets, x: Any, target: torch.Tensor, old_value: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`critic_loss` of a minibatch of rows whose critic inputs are ``x``."""
    return critic_loss(cfg, nets.critic(x).squeeze(-1), target, old_value)


def _chunk_rows(chunks: Chunks, take: torch.Tensor | None) -> tuple[Any, Any, Any, Any]:
    """The chunks ``take`` (default all): their rows' indices, which are valid, each chunk's
    first row, and the valid rows' indices."""
    index, valid, first = chunks.index, chunks.valid, chunks.first
    if take is not None:
        index, valid, first = index[take], valid[take], first[take]
    return index, valid, first, index[valid]


class SplitStep:
    """One PPO gradient step in two halves: the actor's (its loss, backpropagated, its
    gradients clipped) in the calling thread, the critic's in the helper thread of
    :func:`critic_helper` where there is one (else after the actor's), then one optimiser
    step. Actor and critic share no parameter, so the gradients are those of the summed
    loss backpropagated once."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        actor_params: list[nn.Parameter],
        critic_params: list[nn.Parameter],
        cfg: Config,
        device: str | torch.device,
    ) -> None:
        self.optimizer = optimizer
        self.params = [p for group in optimizer.param_groups for p in group["params"]]
        self.actor_params, self.critic_params = actor_params, critic_params
        self.max_norm = cfg.max_grad_norm
        self.helper = critic_helper(device)

    def __call__(
        self,
        actor: Callable[[], tuple[torch.Tensor, torch.Tensor]],
        critic: Callable[[], tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        """The step on the losses ``actor()`` (with its statistics) and ``critic()`` (with
        the value loss); the step's statistics (:data:`METRICS`)."""
        for p in self.params:
            p.grad = None  # the optimiser's zero_grad() without its per-call overhead
        helper, critic_params = self.helper, self.critic_params
        pending = None if helper is None else helper.submit(self._half, critic, critic_params)
        stats = self._half(actor, self.actor_params)
        value_loss = self._half(critic, critic_params) if pending is None else pending.result()
        self.optimizer.step()
        return step_stats(stats, value_loss)

    def _half(
        self, loss_of: Callable[[], tuple[torch.Tensor, torch.Tensor]], params: list[nn.Parameter]
    ) -> torch.Tensor:
        loss, out = loss_of()
        loss.backward()
        nn.utils.clip_grad_norm_(params, self.max_norm, foreach=True)
        return out


def critic_helper(device: str | torch.device) -> ThreadPoolExecutor | None:
    """A thread of its own for the critic's half of each PPO minibatch, where that uses a
    core that would idle: on the CPU, with one torch thread per op and a second core for the
    process; else ``None`` (the halves run one after the other). The actor and critic share
    no parameter, so their gradients are the same either way."""
    if torch.device(device).type != "cpu" or torch.get_num_threads() != 1 or _cores() < 2:
        return None
    return _helper_thread()


@functools.cache
def _helper_thread() -> ThreadPoolExecutor:
    """The process's one helper thread, started at the first call."""
    return ThreadPoolExecutor(1, thread_name_prefix="corral-critic")


def _cores() -> int:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _has_front(net: nn.Module) -> bool:
    """Whether ``net`` reads its observations through an :class:`Encoded` front."""
    return any(isinstance(module, Encoded) for module in net.modules())


def _where_done(done: Any, final: Any, now: Any) -> Any:
    """``final`` in the envs that are ``done`` ``[E]``, else ``now`` (arrays ``[E, ...]``,
    NumPy or tensors)."""
    return ops_of(done).where(done.reshape(-1, *([1] * (np.ndim(now) - 1))), final, now)


def _placer(like: Any) -> Any:
    """What moves a tensor to where ``like`` lives: a tensor's device, else a NumPy array."""
    if isinstance(like, torch.Tensor):
        return functools.partial(torch.Tensor.to, device=like.device)
    return to_numpy
