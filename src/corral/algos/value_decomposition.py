"""Value decomposition: VDN and QMIX, a team Q-value mixed from one shared agent network.

Each group is a team: its agents share one agent Q-network (DQN's, see
:mod:`corral.algos.dqn`), whose input is the agent's observation followed by
a one-hot of the agent's index in the group when the group has several agents
(as EPyMARL does), so that shared parameters can still act differently per
agent. Agents act on their own Q values (epsilon-greedy among their legal
actions, as DQN's policy), and learning mixes the values of the actions taken
into the team's ``Q_tot`` (:mod:`corral.algos.mixers`): VDN sums them, QMIX
mixes them monotonically with weights made from the global ``state`` (where
the env has none, from the group's observations joined, as EPyMARL does).

Learning is DQN's replay loop (rollouts of ``train_freq`` env steps, a
:class:`~corral.data.replay.Replay` per group, ``gradient_steps`` per
``train_freq`` env steps from ``learning_starts`` rows, the epsilon schedule),
with one replay row per env step and group (not per agent):

* the team reward of a step is the **mean** of the group's agents' rewards:
  where they share one reward (the matrix games, simple_spread's global
  term) it is that reward, so ``Q_tot`` and the returns keep the env's
  scale (a sum would grow with the number of agents);
* the target is ``r + gamma * Q_tot_target(s', a*)`` with each agent's
  ``a*`` its online network's best legal next action (double Q), valued by
  the target agent network and mixed by the target mixer on the next state;
  no bootstrap where no agent goes on (every agent terminated), a bootstrap
  from the final observation where the episode was truncated;
* an agent that did not act at a step adds 0 to ``Q_tot``, as does, in the
  target, an agent that does not go on;
* Huber loss on ``Q_tot``, gradient norm clipping over the agent network and
  the mixer together, target networks (agent and mixer) updated as DQN's.

With ``recurrent``, the agent network has a GRU (see :mod:`corral.algos.recurrent_q`)
and the replay keeps a stream of joint rows per env, sampled as chunks of ``bptt``
joint steps of one episode; each row's ``Q_tot`` and target are mixed as above.

Every learned agent must act at every step until its episode ends
(``needs_lockstep``): a row is one joint step of the team.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

import torch
from gymnasium import spaces
from torch import nn

from corral.algos.base import AlgoConfig, Algorithm, resolve_device
from corral.algos.dqn import (
    DQNLearner,
    DQNPolicy,
    QConfig,
    check_sequences,
    discrete_spaces,
    double_q_bootstrap,
    masked_huber,
    replay_first_update,
    replay_rollout_steps,
)
from corral.algos.lockstep import acted_in_lockstep, check_all_acting
from corral.algos.mixers import QMixer, VDNMixer, box_bounds
from corral.algos.networks import as_input, flat_dim, frozen_copy, soft_update
from corral.algos.policy import FirstUpdate
from corral.arrays import is_tensor
from corral.arrays.tree import map_tree
from corral.data.replay import Transitions
from corral.data.rollouts import Rollout
from corral.settings import Range

if TYPE_CHECKING:
    from corral.vector.protocols import VecEnv


@dataclass
class Config(QConfig):
    """VDN and QMIX settings (QMIX's mixer sizes are unused by VDN)."""

    mixing_embed: Annotated[int, Range(ge=1)] = 32
    """QMIX: units of the mixing network's hidden layer."""
    hypernet_hidden: Annotated[int, Range(ge=1)] = 64
    """QMIX: hidden units of the hypernetworks that make the mixing weights."""


class ValueDecompositionPolicy(DQNPolicy):
    """DQN's epsilon-greedy legal acting, on one agent network per group whose input ends
    with a one-hot of the agent's index where the group has several agents."""

    def input_dim(self, group: str) -> int:
        n = len(self.groups[group])
        return flat_dim(self.observation_space[group]) + (n if n > 1 else 0)

    def q_input(self, group: str, obs: Any) -> torch.Tensor:
        """Observations ``[..., n, *obs_shape]`` of the group's ``n`` agents, flattened, each
        followed by its agent's one-hot (``n > 1``)."""
        x = as_input(obs, self.observation_space[group], self.device)
        n = len(self.groups[group])
        if n == 1:
            return x
        if x.ndim < 2 or x.shape[-2] != n:
            raise ValueError(
                f"group {group!r}: observations must be laid out [..., n, *obs_shape] with its "
                f"n={n} agents, got a flattened shape {tuple(x.shape)}"
            )
        ids = torch.eye(n, device=x.device).expand(*x.shape[:-1], n)
        return torch.cat([x, ids], -1)


class ValueDecompositionLearner(DQNLearner):
    """Gradient steps on the team's mixed ``Q_tot`` for a :class:`ValueDecompositionPolicy`.

    Holds, beside DQN's target networks, optimisers and replay memories, one
    mixer per group (:attr:`mixer`) and its target (:attr:`target_mixer`).
    """

    policy: ValueDecompositionPolicy

    def __init__(
        self,
        policy: ValueDecompositionPolicy,
        config: Config,
        mixer: Mapping[str, nn.Module],
        state_space: spaces.Space | None,
        *,
        num_envs: int = 1,
    ) -> None:
        self.mixer = {g: m.to(policy.device) for g, m in mixer.items()}
        self.target_mixer = {g: frozen_copy(m) for g, m in self.mixer.items()}
        self.state_space = state_space
        mixes_on_state = any(_needs_state(m) for m in self.mixer.values())
        self.uses_state = mixes_on_state and state_space is not None
        # Without a state, a mixer that needs one mixes on the group's observations joined.
        self.state_from_obs = mixes_on_state and state_space is None
        self._acted: dict[str, torch.Tensor] = {}
        """Per group, on torch rollouts: whether each env's agents ``[E, n]`` acted in lockstep
        in every rollout since the last read (read with the gradient steps' metrics)."""
        super().__init__(policy, config, num_envs=num_envs)

    def parameters(self, group: str) -> list[nn.Parameter]:
        """The agent network's and the mixer's parameters."""
        return [*super().parameters(group), *self.mixer[group].parameters()]

    def rows_per_env(self, group: str) -> int:
        """One replay row per env step (the team's joint step)."""
        return 1

    def update_targets(self) -> None:
        super().update_targets()
        for g, mixer in self.mixer.items():
            soft_update(self.target_mixer[g].parameters(), mixer.parameters(), self.config.tau)

    def update(self, rollouts: Mapping[str, Rollout]) -> dict[str, float]:
        """DQN's update of the team's rows; raises ``UnsupportedEnvError`` where an agent did
        not act at a step of its episode (on torch rollouts, with the first gradient steps'
        metrics, which read the device anyway)."""
        metrics = super().update(rollouts)
        if metrics and self._acted:
            acted, self._acted = self._acted, {}
            for g, rows in acted.items():
                check_all_acting(type(self).__name__, g, self.policy.groups[g], rows.cpu())
        return metrics

    def _store(self, g: str, rollout: Rollout) -> None:
        acted = acted_in_lockstep(rollout).all(0)  # [E, n]
        if is_tensor(acted):
            self._acted[g] = acted & self._acted[g] if g in self._acted else acted
        else:
            check_all_acting(type(self).__name__, g, self.policy.groups[g], acted)
        if not self.config.recurrent:
            rows, keep = joint_steps(rollout, with_state=self.uses_state)
            self.buffer[g].add(rows, keep)
            return
        check_sequences(type(self).__name__, rollout)
        rows, keep = joint_steps(rollout, with_state=self.uses_state, flat=False)
        rows["hidden"] = rollout.extras["hidden"]
        # the team's decision index: its acting agents' (they act together)
        rows["decision"] = torch.where(
            torch.as_tensor(rollout.acting), torch.as_tensor(rollout.decision), -1
        ).amax(-1)
        self.buffer[g].add(rows, keep)

    def _state(self, group: str, t: Mapping[str, Any], key: str) -> torch.Tensor | None:
        """The mixer's state of rows ``t`` (``key``: ``state`` or ``next_state``): the env's,
        or, where it has none, the group's observations ``[B, n * obs_dim]`` joined."""
        if self.uses_state:
            assert self.state_space is not None
            return as_input(t[key], self.state_space, self.policy.device)
        if self.state_from_obs:
            obs = t["obs" if key == "state" else "next_obs"]
            x = as_input(obs, self.policy.observation_space[group], self.policy.device)
            return x.reshape(len(x), -1)
        return None

    def targets(self, group: str, t: Mapping[str, Any]) -> torch.Tensor:
        """The team's TD targets ``[B]`` of joint rows ``t`` of ``group``."""
        policy = self.policy
        with torch.no_grad():
            next_in = policy.q_input(group, t["next_obs"])
            next_q, next_q_target = policy.q[group](next_in), self.target[group](next_in)
            return self.mixed_targets(group, t, next_q, next_q_target)

    def q_tot(
        self, group: str, t: Mapping[str, Any], q_all: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``Q_tot`` ``[B]`` of the actions taken in joint rows ``t`` (with gradients), of the
        agent values ``q_all`` ``[B, n, A]`` (default: the online network's of ``obs``)."""
        policy, device = self.policy, self.policy.device
        action = t["action"] - int(policy.action_space[group].start)
        index = torch.as_tensor(action, dtype=torch.long, device=device)
        if q_all is None:
            q_all = policy.q[group](policy.q_input(group, t["obs"]))
        q = q_all.gather(-1, index[..., None])
        acting = torch.as_tensor(t["acting"], dtype=torch.bool, device=device)
        q = torch.where(acting, q.squeeze(-1), 0.0)
        return self.mixer[group](q, self._state(group, t, "state"))

    def mixed_targets(
        self, group: str, t: Mapping[str, Any], next_q: torch.Tensor, next_q_target: torch.Tensor
    ) -> torch.Tensor:
        """The team's TD targets ``[B]`` of joint rows ``t`` from the online and the target
        agent values ``[B, n, A]`` of their next observations."""
        device = self.policy.device
        mask = torch.as_tensor(t["next_action_mask"], dtype=torch.bool, device=device)
        boot = double_q_bootstrap(next_q, next_q_target, mask)
        live = torch.as_tensor(t["next_live"], dtype=torch.bool, device=device)
        boot = torch.where(live, boot, 0.0)
        mixed = self.target_mixer[group](boot, self._state(group, t, "next_state"))
        terminal = torch.as_tensor(t["terminal"], dtype=torch.bool, device=device)
        reward = torch.as_tensor(t["reward"], dtype=torch.float32, device=device)
        return reward + self.config.gamma * torch.where(terminal, 0.0, mixed)

    def sequence_loss(self, group: str, t: Transitions) -> tuple[torch.Tensor, torch.Tensor]:
        """Recurrent: the Huber loss on ``Q_tot`` (mean over the valid rows) of chunks of joint
        rows ``t`` (``[B, L]`` per field), the online and the target agent network unrolled
        from each chunk's stored first hidden states; and ``Q_tot`` ``[B, L]``."""
        q_all, next_q, next_q_target = self.unrolled(group, t)
        chunks, length = t["valid"].shape
        flat = map_tree(lambda v: v.reshape(chunks * length, *v.shape[2:]), dict(t))
        q_tot = self.q_tot(group, flat, q_all.flatten(0, 1))
        with torch.no_grad():
            goal = self.mixed_targets(
                group, flat, next_q.detach().flatten(0, 1), next_q_target.flatten(0, 1)
            )
        loss = masked_huber(q_tot, goal, flat["valid"], self.config.huber_delta)
        return loss, q_tot.reshape(chunks, length)

    def _learn(self, group: str, t: Transitions) -> dict[str, torch.Tensor]:
        if self.config.recurrent:
            loss, q_tot = self.sequence_loss(group, t)
            self._step(group, loss)
            return {"loss": loss.detach(), "q_tot": q_tot.detach()[t["valid"]].mean()}
        q_tot = self.q_tot(group, t)
        loss = nn.functional.huber_loss(
            q_tot, self.targets(group, t), delta=self.config.huber_delta
        )
        self._step(group, loss)
        return {"loss": loss.detach(), "q_tot": q_tot.detach().mean()}

    def state_dict(self) -> dict[str, Any]:
        """DQN's state and the mixers (online and target)."""
        return {
            **super().state_dict(),
            "mixer": {g: m.state_dict() for g, m in self.mixer.items()},
            "target_mixer": {g: m.state_dict() for g, m in self.target_mixer.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for g, mixer in self.mixer.items():
            mixer.load_state_dict(state["mixer"][g])
            self.target_mixer[g].load_state_dict(state["target_mixer"][g])
        super().load_state_dict(state)


def joint_steps(
    rollout: Rollout, *, with_state: bool, flat: bool = True
) -> tuple[dict[str, Any], Any]:
    """One row per env step of ``rollout``'s group (``[T * E, n, ...]`` per agent field) and the
    mask ``[T * E]`` of the steps where an agent acted (not ``flat``: ``[T, E, ...]``).

    Fields: ``obs``, ``action``, ``acting``, ``action_mask``, ``reward`` (the agents' mean),
    ``next_obs`` (final where the env ended), ``next_action_mask``, ``next_live`` (the agent
    goes on: alive at the step, acts next or was truncated, and was not terminated),
    ``terminal`` (no agent goes on) and, ``with_state``, ``state`` and ``next_state``. Needs a
    rollout of a lockstep env recorded with ``record_next=True``."""
    if not rollout.next:
        raise ValueError("joint_steps() needs a rollout from RolloutBuilder(..., record_next=True)")
    if rollout.action_mask is None:
        raise ValueError("joint_steps() needs the action masks every Discrete group has")
    nxt = rollout.next
    next_live = (nxt["acting"] | rollout.truncated) & rollout.alive & ~rollout.terminated
    fields = {
        "obs": rollout.obs,
        "action": rollout.action,
        "acting": rollout.acting,
        "action_mask": rollout.action_mask,
        "reward": rollout.reward.mean(-1),
        "next_obs": nxt["obs"],
        "next_action_mask": nxt["action_mask"],
        "next_live": next_live,
        "terminal": ~next_live.any(-1),
    }
    if with_state:
        if rollout.state is None or "state" not in nxt:
            raise ValueError(
                "QMIX mixes on Batch.state, but the rollout has none: build the vector env "
                "with state=True"
            )
        fields["state"], fields["next_state"] = rollout.state, nxt["state"]
    if not flat:
        return fields, rollout.acting.any(-1)
    steps, envs = rollout.acting.shape[:2]
    rows = map_tree(lambda x: x.reshape(steps * envs, *x.shape[2:]), fields)
    return rows, rollout.acting.any(-1).reshape(-1)


def _needs_state(mixer: nn.Module) -> bool:
    return not isinstance(mixer, VDNMixer)


_Config = Config  # the settings class as a type: in the class body below, Config is its attribute


class ValueDecomposition(ValueDecompositionLearner, Algorithm):
    """A value-decomposition learner built for ``venv``'s groups ``learn_groups`` (default
    all) with its :class:`ValueDecompositionPolicy`; :class:`VDN` and :class:`QMIX` pick the
    mixer (:meth:`make_mixer`)."""

    Config: ClassVar[type[AlgoConfig]] = Config
    config: _Config
    records_next: ClassVar[bool] = True
    needs_lockstep: ClassVar[bool] = True

    def __init__(
        self,
        venv: VecEnv,
        config: _Config | None = None,
        *,
        learn_groups: Collection[str] | None = None,
        device: str = "cpu",
    ) -> None:
        groups = self.describe(venv, config, learn_groups, resolve_device(device))
        discrete = discrete_spaces(type(self).__name__, self.action_space)
        policy = ValueDecompositionPolicy(
            groups, self.observation_space, discrete, self.config, device=self.device
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.config.seed + 1)
            mixer = {g: self.make_mixer(g, members) for g, members in groups.items()}
        ValueDecompositionLearner.__init__(
            self, policy, self.config, mixer, self.state_space, num_envs=self.num_envs
        )

    def make_mixer(self, group: str, agents: Sequence[str]) -> nn.Module:
        """The mixer of ``group``, of ``agents``."""
        raise NotImplementedError

    @property
    def rollout_steps(self) -> int:
        """Vector steps per rollout: ``train_freq`` env steps, rounded up to whole vector steps."""
        return replay_rollout_steps(self.config, self.num_envs)

    def first_update(self) -> FirstUpdate:
        """Filling to ``learning_starts`` rows (one per env step and group), then ``train_freq``
        env steps, to the end of a rollout."""
        return replay_first_update(self, self.num_envs, len(self.groups))


class VDN(ValueDecomposition):
    """VDN (Sunehag et al. 2018): ``Q_tot`` is the sum of the agents' Q values."""

    name: ClassVar[str] = "vdn"

    def make_mixer(self, group: str, agents: Sequence[str]) -> nn.Module:
        return VDNMixer()


class QMIX(ValueDecomposition):
    """QMIX (Rashid et al. 2018): ``Q_tot`` mixes the agents' Q values monotonically, with
    weights made by hypernetworks of the env's global ``state``, or, for an env without one
    (RWARE, LBF), of the group's observations joined (as EPyMARL does)."""

    name: ClassVar[str] = "qmix"
    uses_state: bool = True

    def make_mixer(self, group: str, agents: Sequence[str]) -> nn.Module:
        if self.state_space is not None:
            state_dim = flat_dim(self.state_space)
            bounds = box_bounds(self.state_space)
        else:
            state_dim = len(agents) * flat_dim(self.observation_space[group])
            bounds = box_bounds(self.observation_space[group], copies=len(agents))
        cfg = self.config
        return QMixer(len(agents), state_dim, cfg.mixing_embed, cfg.hypernet_hidden, bounds)
