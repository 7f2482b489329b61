"""The shared pieces of the learners' networks: the gradient step, the Polyak update."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from corral.algos.networks import gradient_step, soft_update  # noqa: E402


def test_soft_update_moves_each_target_tau_of_the_way_to_its_online_parameter() -> None:
    torch.manual_seed(0)
    online, target = nn.Linear(3, 2), nn.Linear(3, 2)
    before = [p.detach().clone() for p in target.parameters()]
    soft_update(target.parameters(), online.parameters(), 0.25)
    for new, old, o in zip(target.parameters(), before, online.parameters(), strict=True):
        torch.testing.assert_close(new, 0.75 * old + 0.25 * o)
    with pytest.raises(ValueError, match=r"shorter|longer"):
        soft_update(target.parameters(), list(online.parameters())[:1], 0.5)


def test_a_gradient_step_clips_each_parameter_set_apart_and_clears_old_gradients() -> None:
    torch.manual_seed(0)
    a, b = nn.Linear(4, 1), nn.Linear(4, 1)
    x = torch.randn(8, 4)
    loss = (a(x) * 100).pow(2).mean() + b(x).pow(2).mean() * 1e-3  # a's gradient far above 1
    grads = torch.autograd.grad(loss, [*a.parameters(), *b.parameters()], retain_graph=True)
    expected = []
    for group in (grads[:2], grads[2:]):
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in group]))
        expected += [g * min(1.0, 1.0 / (float(norm) + 1e-6)) for g in group]
    params = [*a.parameters(), *b.parameters()]
    for p in params:
        p.grad = torch.full_like(p, 7.0)  # stale: must not add to the step's gradients
    before = [p.detach().clone() for p in params]
    gradient_step(
        torch.optim.SGD(params, lr=1.0), loss, a.parameters(), b.parameters(), max_norm=1.0
    )
    for p, old, g in zip(params, before, expected, strict=True):
        torch.testing.assert_close(old - p.detach(), g)
