"""The shared pieces of the learners' networks: the gradient step, the Polyak update, the
networks' inputs."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import numpy as np  # noqa: E402
from gymnasium import spaces  # noqa: E402
from torch import nn  # noqa: E402

from corral.algos.networks import as_input, flat_dim, gradient_step, soft_update  # noqa: E402


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


SPACES = {
    "multi_discrete": spaces.MultiDiscrete([3, 4]),
    "multi_discrete_start": spaces.MultiDiscrete([[2, 3], [4, 2]], start=[[1, -2], [0, 5]]),
    "tuple": spaces.Tuple((spaces.Discrete(3, start=1), spaces.Box(-1, 1, (2,)))),
    "dict_of_multi_discrete": spaces.Dict(
        {"b": spaces.MultiDiscrete([2, 5]), "a": spaces.Box(0, 1, (3,))}
    ),
}


def _stacked(space: spaces.Space, values: list) -> object:
    """Values of ``space`` laid out ``[batch, ...]`` as the vector layer gives them."""
    if isinstance(space, spaces.Dict):
        return {k: _stacked(sub, [v[k] for v in values]) for k, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(_stacked(sub, [v[i] for v in values]) for i, sub in enumerate(space.spaces))
    return np.stack([np.asarray(v) for v in values])


@pytest.mark.parametrize("on", ["numpy", "torch"])
@pytest.mark.parametrize("name", SPACES)
def test_inputs_are_gymnasium_s_flattening_of_the_observation(name: str, on: str) -> None:
    """The networks are sized by ``flat_dim`` (one-hots): a MultiDiscrete value passed through
    raw (2 numbers for 7 inputs) and a Tuple one failed inside the first layer."""
    space = SPACES[name]
    space.seed(0)
    values = [space.sample() for _ in range(5)]
    expected = np.stack([spaces.flatten(space, v) for v in values]).astype(np.float32)
    stacked = _stacked(space, values)
    if on == "torch":
        stacked = _on_torch(stacked)
    got = as_input(stacked, space, "cpu")
    assert got.shape == (5, flat_dim(space))
    np.testing.assert_array_equal(got.numpy(), expected)


def _on_torch(x: object) -> object:
    if isinstance(x, dict):
        return {k: _on_torch(v) for k, v in x.items()}
    if isinstance(x, tuple):
        return tuple(_on_torch(v) for v in x)
    return torch.as_tensor(x)
