"""Encoders: shapes by space, the default's equality with the networks corral always built,
a user's factory in actor and critic, CNN runs on an image env, and bad encoders refused."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from gymnasium import spaces  # noqa: E402
from support.cli import FAST, run  # noqa: E402
from support.images import LIGHTS, SMALL_ENCODER, SmallEncoder  # noqa: E402
from support.runs import Killed, kill_after_checkpoint, without_time  # noqa: E402
from torch import nn  # noqa: E402

import corral  # noqa: E402
from corral.algos.dqn import DQN  # noqa: E402
from corral.algos.dqn import Config as DQNConfig  # noqa: E402
from corral.algos.encoders import (  # noqa: E402
    CNN,
    FEATURES,
    Encoded,
    Parts,
    PerKey,
    make_encoder,
    shaped,
)
from corral.algos.maddpg import MADDPG, Critic  # noqa: E402
from corral.algos.maddpg import Config as MADDPGConfig  # noqa: E402
from corral.algos.mappo import IPPO, MAPPO, Config  # noqa: E402
from corral.algos.networks import as_input, flat_dim, mlp  # noqa: E402
from corral.algos.row_inputs import RowInputs  # noqa: E402
from corral.algos.value_decomposition import QMIX, VDN  # noqa: E402
from corral.algos.value_decomposition import Config as VDConfig  # noqa: E402
from corral.errors import ConfigError  # noqa: E402
from corral.training import TrainConfig, load_config  # noqa: E402
from corral.training.collector import Collector  # noqa: E402
from corral.training.runner import Runner, evaluate_policy, load_run  # noqa: E402

torch.set_num_threads(1)

VECTOR = spaces.Box(-1.0, 1.0, shape=(5,), dtype=np.float32)
PIXELS = spaces.Box(0, 255, shape=(40, 36, 3), dtype=np.uint8)
SMALL_PIXELS = spaces.Box(0, 255, shape=(8, 8, 3), dtype=np.uint8)
FLOAT_IMAGE = spaces.Box(0.0, 1.0, shape=(8, 8, 3), dtype=np.float32)
MIXED = spaces.Dict({"image": SMALL_PIXELS, "pos": VECTOR, "id": spaces.Discrete(3)})
SHORT = {
    "num_envs": 2,
    "rollout_steps": 16,
    "eval_every": 0,
    "eval_episodes": 4,
    "checkpoint_every": 0,
    "device": "cpu",
    "tensorboard": False,
}
PLAIN = {k: v for k, v in SHORT.items() if k != "rollout_steps"}
"""SHORT for a replay learner (its rollouts follow ``train_freq``)."""
DQN_SHORT = {
    "learning_starts": 64,
    "batch_size": 32,
    "train_freq": 4,
    "epsilon_decay_steps": 300,
    "target_update_interval": 50,
}
DQN_STEPS = 800


def features(encoder: nn.Module, space: spaces.Space, batch: int = 3) -> torch.Tensor:
    """``encoder``'s features of ``batch`` samples of ``space``."""
    space.seed(0)
    obs = [space.sample() for _ in range(batch)]
    if isinstance(space, spaces.Dict):
        stacked = {k: np.stack([o[k] for o in obs]) for k in space.spaces}
    else:
        stacked = np.stack(obs)
    return encoder(shaped(as_input(stacked, space, "cpu"), space))


# -- shapes ----------------------------------------------------------------------------


def test_mlp_is_no_encoder_and_a_vector_under_cnn_is_flattened():
    assert make_encoder("mlp", VECTOR) is None
    flat = make_encoder("cnn", spaces.Dict({"image": SMALL_PIXELS, "pos": VECTOR}))
    assert flat is not None and flat.out_dim == FEATURES + 5
    assert tuple(features(flat, spaces.Dict({"image": SMALL_PIXELS, "pos": VECTOR})).shape) == (
        3,
        FEATURES + 5,
    )


@pytest.mark.parametrize("space", [PIXELS, SMALL_PIXELS, FLOAT_IMAGE], ids=str)
def test_cnn_features_of_images(space):
    encoder = make_encoder("cnn", space)
    assert isinstance(encoder, CNN)
    assert encoder.out_dim == FEATURES
    assert tuple(features(encoder, space).shape) == (3, FEATURES)


def test_cnn_takes_nature_dqn_convolutions_from_36_pixels():
    strides = [c.stride for c in make_encoder("cnn", PIXELS).convs if isinstance(c, nn.Conv2d)]
    small = [c.stride for c in make_encoder("cnn", SMALL_PIXELS).convs if isinstance(c, nn.Conv2d)]
    assert strides == [(4, 4), (2, 2), (1, 1)]
    assert small == [(1, 1), (1, 1)]


def test_cnn_scales_uint8_pixels_to_floats_in_0_1():
    torch.manual_seed(0)
    of_pixels = make_encoder("cnn", SMALL_PIXELS)
    of_floats = make_encoder("cnn", FLOAT_IMAGE)
    of_floats.load_state_dict(of_pixels.state_dict())
    image = np.random.default_rng(0).integers(0, 256, size=(2, 8, 8, 3)).astype(np.uint8)
    pixels = shaped(as_input(image, SMALL_PIXELS, "cpu"), SMALL_PIXELS)
    floats = shaped(as_input(image / 255, FLOAT_IMAGE, "cpu"), FLOAT_IMAGE)
    torch.testing.assert_close(of_pixels(pixels), of_floats(floats))


def test_a_dict_is_encoded_per_key_in_the_spaces_order():
    encoder = make_encoder("cnn", MIXED)
    assert list(encoder.parts) == list(MIXED.spaces)
    assert isinstance(encoder.parts["image"], CNN)
    assert encoder.out_dim == FEATURES + 5 + 3
    assert tuple(features(encoder, MIXED).shape) == (3, FEATURES + 8)
    # the Discrete key arrives one-hot, first (a Dict space sorts its keys)
    assert list(MIXED.spaces) == ["id", "image", "pos"]
    obs = {"image": np.zeros((1, 8, 8, 3), np.uint8), "pos": np.zeros((1, 5)), "id": [2]}
    out = encoder(shaped(as_input(obs, MIXED, "cpu"), MIXED))
    assert out[0, :3].tolist() == [0.0, 0.0, 1.0]


def test_encoded_passes_extra_columns_after_the_features():
    front = Encoded(SmallEncoder(VECTOR), VECTOR)
    x = torch.randn(4, 2, 5 + 3)  # leading axes [E, n], an observation and 3 more columns
    out = front(x)
    assert out.shape == (4, 2, 16 + 3)
    torch.testing.assert_close(out[..., 16:], x[..., 5:])


# -- the default: the networks corral built before encoders ----------------------------


def test_default_mappo_networks_equal_the_plain_mlps():
    venv = corral.make_vec("mpe2/simple_spread_v3", 2, seed=0, state=True)
    algo = MAPPO(venv, Config(seed=3), device="cpu")
    ((group, agents),) = venv.groups.items()
    n, obs_space = len(agents), venv.observation_space(group)
    # the construction before encoders, the oracle: actor then critic from one seed
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        actor = mlp(flat_dim(obs_space) + n, 5, (64, 64), out_gain=0.01)
        critic = mlp(flat_dim(venv.state_space) + 1 + n, 1, (64, 64))
    nets = algo.policy.nets[group]
    for built, oracle in ((nets.actor.net, actor), (nets.critic, critic)):
        assert built.state_dict().keys() == oracle.state_dict().keys()
        for key, value in oracle.state_dict().items():
            assert torch.equal(built.state_dict()[key], value), key
        x = torch.randn(7, oracle[0].in_features)
        assert torch.equal(built(x), oracle(x))


def test_default_dqn_network_equals_the_plain_mlp():
    venv = corral.make_vec("mpe2/simple_spread_v3", 2, seed=0)
    ((group, _),) = venv.groups.items()
    algo = DQN(venv, DQNConfig(seed=5), device="cpu")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(5)
        oracle = mlp(flat_dim(venv.observation_space(group)), 5, (64, 64))
    built = algo.policy.q[group]
    for key, value in oracle.state_dict().items():
        assert torch.equal(built.state_dict()[key], value), key


# -- a user's factory --------------------------------------------------------------------


def test_a_users_factory_encodes_actor_and_critic_and_learns(tmp_path):
    built: list[tuple[spaces.Space, SmallEncoder, dict]] = []

    def factory(space: spaces.Space) -> nn.Module:
        encoder = SmallEncoder(space)
        built.append((space, encoder, copy.deepcopy(encoder.state_dict())))
        return encoder

    corral.train(
        "ippo",
        LIGHTS,
        encoder=factory,
        total_steps=64,
        run_dir=str(tmp_path / "run"),
        progress=False,
        **SHORT,
    )
    assert len(built) == 2  # the actor's and the critic's, of the one group's observations
    (_, actor, _), (_, critic, _) = built
    assert actor is not critic and all(space.shape == (8, 8, 3) for space, *_ in built)
    for _, encoder, initial in built:
        grad = encoder.linear.weight.grad
        assert grad is not None and grad.abs().sum() > 0
        assert not torch.equal(encoder.linear.weight, initial["linear.weight"])


def test_a_users_factory_by_module_attr_is_saved_by_name_and_read_back_only_if_allowed(tmp_path):
    cfg = load_config("ippo", LIGHTS, {**SHORT, "encoder": SMALL_ENCODER})
    written = cfg.to_dict()
    assert written["algo_config"]["encoder"] == SMALL_ENCODER
    with pytest.raises(ConfigError, match=r"encoder .*--allow-import support.images:SmallEncoder"):
        TrainConfig.from_dict(written, allow_imports=[LIGHTS])
    back = TrainConfig.from_dict(written, allow_imports=[LIGHTS, SMALL_ENCODER])
    assert back.algo_config.encoder == SMALL_ENCODER
    # a factory object given in Python is recorded by its module:attr where that finds it
    assert (
        load_config("ippo", LIGHTS, {"encoder": SmallEncoder}).to_dict()["algo_config"]["encoder"]
        == SMALL_ENCODER
    )
    local = load_config("ippo", LIGHTS, {"encoder": lambda space: SmallEncoder(space)})
    recorded = local.to_dict()["algo_config"]["encoder"]
    assert recorded.startswith("object:") and recorded.endswith("<lambda>")


def test_a_factory_object_recorded_in_a_saved_config_is_refused_when_built():
    with pytest.raises(ConfigError, match=r"^encoder 'object:f': .*build it in Python"):
        make_encoder("object:f", VECTOR)


# -- CNN runs ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["uint8", "float"])
def test_ippo_with_a_cnn_learns_an_image_env(tmp_path, kind):
    results = corral.train(
        "ippo",
        LIGHTS,
        encoder="cnn",
        env_kwargs={"kind": kind},
        total_steps=384,
        run_dir=str(tmp_path / "run"),
        progress=False,
        **{**SHORT, "num_envs": 4, "eval_episodes": 8},
    )
    # 4 decisions an episode, each right with probability 1/2 by chance
    assert results.final_eval >= 3.5


def test_dqn_with_a_cnn_runs_on_an_image_env(tmp_path):
    venv = corral.make_vec(LIGHTS, 2, seed=0)
    algo = DQN(venv, DQNConfig(encoder="cnn"), device="cpu")
    ((group, _),) = venv.groups.items()
    q = algo.policy.q[group]
    assert isinstance(q[0], Encoded) and isinstance(q[0].encoder, CNN)
    batch = venv.reset(seed=0)
    actions, _ = algo.policy.act(batch)
    assert actions[group].shape == (2, 2)


@pytest.mark.parametrize("encoder", ["cnn", "mlp"])
def test_ippo_learns_dict_observations(tmp_path, encoder):
    results = corral.train(
        "ippo",
        LIGHTS,
        encoder=encoder,
        env_kwargs={"kind": "dict"},
        total_steps=384,
        run_dir=str(tmp_path / "run"),
        progress=False,
        **{**SHORT, "num_envs": 4, "eval_episodes": 8},
    )
    assert results.final_eval >= 3.5  # of 4; chance is 2


@pytest.mark.parametrize("encoder", ["cnn", "mlp"])
def test_dqn_learns_dict_observations(tmp_path, encoder):
    results = corral.train(
        "dqn",
        LIGHTS,
        encoder=encoder,
        env_kwargs={"kind": "dict"},
        total_steps=DQN_STEPS,
        run_dir=str(tmp_path / "run"),
        progress=False,
        **{**PLAIN, **DQN_SHORT, "num_envs": 4, "eval_episodes": 8},
    )
    assert results.final_eval >= 3.5  # of 4; chance is 2


def test_a_mappo_run_on_dict_observations_resumes_as_if_never_killed(tmp_path, monkeypatch):
    """Episodes of 4 steps and rollouts of 16: no episode is in flight at a checkpoint."""

    def settings(name: str) -> TrainConfig:
        return load_config(
            "mappo",
            LIGHTS,
            {
                **SHORT,
                "encoder": "cnn",
                "env_kwargs": {"kind": "dict", "sides": "alternate"},
                "total_steps": 96,
                "checkpoint_every": 32,
                "log_every": 32,
                "run_dir": str(tmp_path / name),
            },
        )

    with Runner(settings("whole"), progress=False, allow_imports=[LIGHTS]) as runner:
        whole = runner.train()
    with monkeypatch.context() as patch:
        kill_after_checkpoint(patch, 64)
        with pytest.raises(Killed), Runner(settings("killed"), progress=False) as runner:
            runner.train()
    with Runner.resume(tmp_path / "killed", progress=False, allow_imports=[LIGHTS]) as runner:
        assert runner.env_steps == 64
        resumed = runner.train()
        weights = runner.algo.policy.nets["agent"].state_dict()
    assert resumed.env_steps == 96
    assert without_time(resumed.metrics) == without_time(whole.metrics)
    _, algo, _ = load_run(tmp_path / "whole", "latest", allow_imports=[LIGHTS])
    for key, value in algo.policy.nets["agent"].state_dict().items():
        assert torch.equal(value, weights[key]), key


@pytest.mark.parametrize("cls", [VDN, QMIX])
def test_vdn_and_qmix_put_a_cnn_before_their_agent_id_columns(cls):
    venv = corral.make_vec(LIGHTS, 2, seed=0)  # two agents: a one-hot id after the image
    algo = cls(venv, VDConfig(encoder="cnn", learning_starts=8, train_freq=4))
    ((group, agents),) = venv.groups.items()
    q = algo.policy.q[group]
    assert isinstance(q[0], Encoded) and isinstance(q[0].encoder, CNN)
    assert q[0].obs_dim == flat_dim(algo.observation_space[group])
    assert q[1].in_features == q[0].out_dim + len(agents)  # the features, then the id
    Collector(venv, algo, seed=0).run(64)
    assert algo.gradient_step > 0
    venv.close()


@pytest.mark.parametrize("cls", [VDN, QMIX])
def test_vdn_and_qmix_learn_from_dict_observations_stored_key_by_key(cls):
    venv = corral.make_vec(LIGHTS, 2, seed=0, env_kwargs={"kind": "dict"})
    algo = cls(venv, VDConfig(encoder="cnn", learning_starts=8, train_freq=4))
    ((group, _),) = venv.groups.items()
    before = copy.deepcopy(algo.policy.q[group].state_dict())
    Collector(venv, algo, seed=0).run(64)
    venv.close()
    assert algo.gradient_step > 0
    stored = algo.buffer[group].state_dict()["data"]["obs"]
    assert stored["image"].dtype == np.uint8 and stored["image"].shape[1:] == (2, 8, 8, 3)
    after = algo.policy.q[group].state_dict()
    assert not all(torch.equal(value, after[key]) for key, value in before.items())


# -- bad encoders -------------------------------------------------------------------------


class NoSize(nn.Module):
    def forward(self, x):
        return x


class WrongSize(nn.Module):
    out_dim = 4

    def forward(self, x):
        return torch.zeros(len(x), 3)


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("resnet", r"^encoder must be one of \['mlp', 'cnn'\], 'module:attr'.*got 'resnet'$"),
        (3, r"^encoder must be one of .*got '3'$"),
    ],
)
def test_a_bad_setting_is_refused_when_the_config_is_built(setting, message):
    with pytest.raises(ConfigError, match=message):
        load_config("mappo", LIGHTS, {"encoder": setting})


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        ("no_such_module_xyz:f", r"^encoder 'no_such_module_xyz:f': cannot import it: No module"),
        ("support.images:Nowhere", r"^encoder 'support.images:Nowhere': cannot import it"),
        (lambda space: "features", r"returned str for .*: expected an nn.Module with a positive"),
        (lambda space: NoSize(), r"returned NoSize for .*: expected an nn.Module with a posit"),
        (lambda space: WrongSize(), r"maps a batch of 2 observations of .* to \(2, 3\): expec"),
    ],
)
def test_a_bad_factory_is_refused_with_one_line_naming_the_setting(factory, message):
    with pytest.raises(ConfigError, match=message) as caught:
        make_encoder(factory, VECTOR)
    assert "\n" not in str(caught.value) and str(caught.value).startswith("encoder ")


def test_cnn_on_vector_observations_is_refused():
    with pytest.raises(ConfigError, match=r"^encoder cnn reads image observations .*encoder=mlp$"):
        make_encoder("cnn", VECTOR)
    with pytest.raises(ConfigError, match=r"at least 5x5 pixels"):
        make_encoder("cnn", spaces.Box(0, 255, shape=(4, 4, 3), dtype=np.uint8))


def test_the_cli_refuses_cnn_on_a_vector_env_with_rc_2_and_no_run_dir(capsys, tmp_path):
    run_dir = tmp_path / "run"
    code, _, err = run(
        capsys,
        "train",
        "ippo",
        "--env",
        "mpe2/simple_spread_v3",
        "--total-steps",
        "80",
        "--run-dir",
        str(run_dir),
        "--no-progress",
        "--set",
        *FAST,
        "encoder=cnn",
    )
    assert code == 2 and "encoder cnn reads image observations" in err
    assert not run_dir.exists()


def test_help_lists_the_encoder_setting(capsys):
    code, out, _ = run(capsys, "train", "ippo", "--help")
    assert code == 0
    assert "encoder" in out and "cnn" in out


def test_a_cnn_run_is_rebuilt_from_its_checkpoint(tmp_path: Path):
    run_dir = tmp_path / "run"
    results = corral.train(
        "ippo", LIGHTS, encoder="cnn", total_steps=32, run_dir=str(run_dir), progress=False, **SHORT
    )
    config, algo, _ = load_run(run_dir, "latest", allow_imports=[LIGHTS])
    assert isinstance(algo, MAPPO) and config.algo_config.encoder == "cnn"
    nets = algo.policy.nets["agent"]
    assert isinstance(nets.actor.net[0].encoder, CNN) and isinstance(nets.critic[0].encoder, CNN)
    again = evaluate_policy(config, algo, 4)
    assert again.columns()["eval_return"] == results.final_eval


# -- image rows in the PPO update -------------------------------------------------------------


@pytest.mark.parametrize("kind", ["uint8", "float", "dict"])
def test_ppo_keeps_image_rows_stored_once_and_learns_the_numbers_of_float_rows(kind):
    venv = corral.make_vec(LIGHTS, 2, seed=0, env_kwargs={"kind": kind})
    algo = IPPO(venv, Config(encoder="cnn", rollout_steps=8, epochs=2, minibatches=3, seed=0))
    rollouts = {}
    algo.learn = rollouts.update  # keep the first rollout instead of learning from it
    Collector(venv, algo, seed=0).run(2 * 8)
    venv.close()
    (g,) = rollouts
    rows = algo.rollout_rows(g, rollouts[g])
    actor_in, critic_in = rows["actor_in"], rows["critic_in"]
    assert isinstance(actor_in, RowInputs) and actor_in.stored is critic_in.stored
    assert isinstance(actor_in[torch.arange(2)], Parts)  # no joined copy for a CNN front
    image = actor_in.stored.obs["image"] if kind == "dict" else actor_in.stored.obs
    assert image.dtype == (torch.float32 if kind == "float" else torch.uint8)
    # the same rows as float tensors, as the update took them before
    index = torch.arange(len(actor_in))
    floats = {**rows, "actor_in": actor_in.floats(index), "critic_in": critic_in.floats(index)}
    twin = copy.deepcopy(algo)
    assert algo.ppo(g, **rows) == twin.ppo(g, **floats)
    mine, theirs = algo.state_dict()["nets"][g], twin.state_dict()["nets"][g]
    for name, value in mine.items():
        assert torch.equal(value, theirs[name]), name


@pytest.mark.parametrize("kind", ["uint8", "float"])
def test_mappo_encodes_an_image_state_with_the_critics_cnn_and_stores_it_once(kind):
    venv = corral.make_vec(LIGHTS, 2, seed=0, state=True, env_kwargs={"kind": kind, "state": True})
    algo = MAPPO(venv, Config(encoder="cnn", rollout_steps=8, epochs=2, minibatches=3, seed=0))
    ((g, _),) = venv.groups.items()
    critic = algo.policy.nets[g].critic
    cnn = [m for m in critic.modules() if isinstance(m, CNN)]
    # two 3x3 convolutions leave 64 maps of 4 x 12 of the [8, 16] state (4 x 4 of an observation)
    assert len(cnn) == 1 and cnn[0].linear.in_features == 64 * 4 * 12
    rollouts = {}
    algo.learn = rollouts.update
    Collector(venv, algo, seed=0).run(2 * 8)
    venv.close()
    rows = algo.rollout_rows(g, rollouts[g])
    critic_in = rows["critic_in"]
    assert critic_in.stored is not rows["actor_in"].stored  # the critic reads the state
    state = critic_in.stored.obs
    assert tuple(state.shape[1:]) == (8, 16, 3)
    assert state.dtype == (torch.float32 if kind == "float" else torch.uint8)
    index = torch.arange(len(critic_in))
    floats = {
        **rows,
        "actor_in": rows["actor_in"].floats(index),
        "critic_in": critic_in.floats(index),
    }
    twin = copy.deepcopy(algo)
    assert algo.ppo(g, **rows) == twin.ppo(g, **floats)


def test_mappo_with_a_cnn_learns_from_an_image_state(tmp_path):
    results = corral.train(
        "mappo",
        LIGHTS,
        encoder="cnn",
        env_kwargs={"state": True},
        total_steps=384,
        run_dir=str(tmp_path / "run"),
        progress=False,
        **{**SHORT, "num_envs": 4, "eval_episodes": 8},
    )
    assert results.final_eval >= 3.5


# -- MADDPG ----------------------------------------------------------------------------------


def test_maddpg_puts_a_users_factory_before_actor_and_critic_and_trains_both(tmp_path):
    built: list[tuple[SmallEncoder, dict]] = []

    def factory(space: spaces.Space) -> nn.Module:
        encoder = SmallEncoder(space)
        built.append((encoder, copy.deepcopy(encoder.state_dict())))
        return encoder

    venv = corral.make_vec(LIGHTS, 2, seed=0, env_kwargs={"actions": "box"})
    settings = {"learning_starts": 8, "batch_size": 8, "train_freq": 2, "encoder": factory}
    algo = MADDPG(venv, MADDPGConfig(**settings))
    assert len(built) == 2  # the actor's and the critic's, of the one group's observations
    (actor, _), (critic, _) = built
    assert algo.policy.actor["agent"][0].encoder is actor
    assert isinstance(algo.critic["agent"], Critic)
    assert algo.critic["agent"].encoders["agent"].encoder is critic
    # the critic reads both agents' features (one encoder), their actions, the agent's
    # index, its own features and its own action
    head = algo.critic["agent"].head[0]
    assert head.in_features == 2 * critic.out_dim + 2 + 2 + critic.out_dim + 1
    Collector(venv, algo, seed=0).run(2 * 24)
    venv.close()
    for encoder, initial in built:
        assert not torch.equal(encoder.linear.weight, initial["linear.weight"])
    target = algo.critic_target["agent"].encoders["agent"].encoder
    assert target is not critic and not torch.equal(target.linear.weight, critic.linear.weight)


@pytest.mark.parametrize("kind", ["uint8", "dict"])
def test_maddpg_with_a_cnn_trains_on_an_image_env_with_continuous_actions(tmp_path, kind):
    results = corral.train(
        "maddpg",
        LIGHTS,
        encoder="cnn",
        env_kwargs={"kind": kind, "actions": "box"},
        total_steps=64,
        run_dir=str(tmp_path / "run"),
        progress=False,
        **{**PLAIN, "learning_starts": 16, "batch_size": 8, "train_freq": 8},
    )
    assert results.env_steps == 64
    _, algo, _ = load_run(tmp_path / "run", "latest", allow_imports=[LIGHTS])
    assert isinstance(algo.policy.actor["agent"][0].encoder, (CNN, PerKey))
    assert isinstance(algo.critic["agent"], Critic)
