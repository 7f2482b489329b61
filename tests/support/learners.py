"""What the PPO learners' differential tests share: a helper thread that records who handed
it work, and a bit-for-bit comparison of two learners' state."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch


class CountingExecutor(ThreadPoolExecutor):
    """One worker thread; ``submitted`` holds the name of the thread of each submit."""

    def __init__(self) -> None:
        super().__init__(1)
        self.submitted: list[str] = []

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.submitted.append(threading.current_thread().name)
        return super().submit(fn, *args, **kwargs)


def assert_same_state(mine: dict[str, Any], theirs: dict[str, Any], g: str) -> None:
    """Group ``g``'s networks and optimiser state in two ``state_dict()``s equal bit for bit."""
    for name, value in mine["nets"][g].items():
        assert torch.equal(value, theirs["nets"][g][name]), name
    for state, other in zip(
        mine["optimizers"][g]["state"].values(),
        theirs["optimizers"][g]["state"].values(),
        strict=True,
    ):
        assert all(torch.equal(state[k], other[k]) for k in state)


METRICS = ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_frac")


def textbook_step(
    cfg: Any,
    optimizer: torch.optim.Optimizer,
    dist: Any,
    value: torch.Tensor,
    rows: dict[str, torch.Tensor],
    actor_params: Any,
    critic_params: Any,
) -> torch.Tensor:
    """One PPO minibatch step written plainly, on the policy ``dist`` and (normalised) values
    ``value`` of a minibatch's ``rows`` (``sample``, ``old_log_prob``, ``advantage``,
    ``target``, ``old_value``): one loss, the optimiser's ``zero_grad``, one backward pass,
    torch's ``clip_grad_norm_`` of the actor's and the critic's parameters apart, one step.
    Its statistics, in the order of :data:`METRICS`."""
    log_ratio = dist.log_prob(rows["sample"]) - rows["old_log_prob"]
    ratio, adv = log_ratio.exp(), rows["advantage"]
    clipped = ratio.clamp(1 - cfg.clip, 1 + cfg.clip)
    policy_loss = -torch.min(ratio * adv, clipped * adv).mean()
    old, target = rows["old_value"], rows["target"]
    value_clipped = old + (value - old).clamp(-cfg.value_clip, cfg.value_clip)
    value_loss = 0.5 * torch.max((value - target) ** 2, (value_clipped - target) ** 2).mean()
    entropy = dist.entropy().mean()
    loss = policy_loss + cfg.vf_coef * value_loss - cfg.ent_coef * entropy
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(actor_params, cfg.max_grad_norm)
    torch.nn.utils.clip_grad_norm_(critic_params, cfg.max_grad_norm)
    optimizer.step()
    with torch.no_grad():
        approx_kl = ((ratio - 1) - log_ratio).mean()
        clip_frac = ((ratio - 1).abs() > cfg.clip).float().mean()
        return torch.stack([policy_loss, value_loss, entropy, approx_kl, clip_frac])


def textbook_metrics(history: list[torch.Tensor]) -> dict[str, float]:
    """The means of the steps' statistics, by name."""
    return dict(zip(METRICS, torch.stack(history).mean(dim=0).tolist(), strict=True))
