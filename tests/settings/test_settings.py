"""Settings are checked against the range declared next to each field, from the command line,
from a file and from Python; the run setting ``timeout`` reaches the vector backend."""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from pathlib import Path

import pytest

pytest.importorskip("yaml")

import yaml
from support.tabular import TINY

from corral import cli
from corral.algos import ALGORITHMS, algorithm_class
from corral.settings import Range, check_ranges, declared_ranges, field_docs
from corral.training import ConfigError, RunConfig, load_config
from corral.training.config import coerce
from corral.training.runner import build_venv, read_run_config

AT_LEAST_0, AT_LEAST_1, POSITIVE = "at least 0", "at least 1", "greater than 0"
UNIT, RATE = "in [0, 1]", "in (0, 1]"
SEED = f"in [0, {2**64 - 1}]"  # torch takes no larger seed

WAIT = "in [0, 1000000000]"
RUN_BAD = [  # setting, a bad value as typed after --set, the range the error states
    ("total_steps", "-100", AT_LEAST_1),
    ("total_steps", "0", AT_LEAST_1),
    ("eval_every", "-1", AT_LEAST_0),
    ("checkpoint_every", "-1", AT_LEAST_0),
    ("log_every", "0", AT_LEAST_1),
    ("num_envs", "0", "in [1, 16777216]"),
    ("num_envs", "16777217", "in [1, 16777216]"),
    ("eval_episodes", "0", AT_LEAST_1),
    ("seed", "-1", SEED),
    ("seed", str(2**64), SEED),
    ("torch_threads", "0", AT_LEAST_1),
    ("num_workers", "0", AT_LEAST_1),
    ("envs_per_worker", "-2", AT_LEAST_1),
    ("timeout", "-1", WAIT),
    ("start_timeout", "-5", WAIT),
    ("timeout", "inf", "a finite number " + WAIT),
    ("sample_timeout", "2000000000", WAIT),  # threading and Ray wait no longer
    ("num_cpus_per_worker", "0", POSITIVE),
]
SHARED_BAD = [  # AlgoConfig's settings, in every algorithm
    ("gamma", "5", UNIT),
    ("gamma", "-0.1", UNIT),
    ("gamma", "nan", "a finite number " + UNIT),
    ("lr", "inf", "a finite number " + POSITIVE),
    ("lr", "0", POSITIVE),
    ("lr", "-0.001", POSITIVE),
    ("seed", "-3", SEED),
    ("seed", str(2**64 + 5), SEED),
]
PPO_BAD = [
    ("rollout_steps", "0", AT_LEAST_1),
    ("epochs", "0", AT_LEAST_1),
    ("minibatches", "0", AT_LEAST_1),
    ("clip", "0", POSITIVE),
    ("value_clip", "-0.2", POSITIVE),
    ("vf_coef", "-1", AT_LEAST_0),
    ("ent_coef", "-0.01", AT_LEAST_0),
    ("gae_lambda", "1.5", UNIT),
    ("max_grad_norm", "0", POSITIVE),
    ("time_scale", "-1", AT_LEAST_0),
    ("pool_size", "0", AT_LEAST_1),
    ("snapshot_interval", "0", AT_LEAST_1),
    ("random_opponent_prob", "1.5", UNIT),
    ("log_std_init", "nan", "a finite number"),  # any number, but a number
]
ALGO_BAD = {
    "mappo": PPO_BAD,
    "ippo": PPO_BAD,
    "dqn": [
        ("buffer_size", "0", AT_LEAST_1),
        ("batch_size", "0", AT_LEAST_1),
        ("learning_starts", "-1", AT_LEAST_0),
        ("train_freq", "0", AT_LEAST_1),
        ("gradient_steps", "0", AT_LEAST_1),
        ("target_update_interval", "0", AT_LEAST_1),
        ("tau", "0", RATE),
        ("tau", "1.5", RATE),
        ("epsilon_start", "1.5", UNIT),
        ("epsilon_end", "-0.1", UNIT),
        ("epsilon_decay_steps", "-1", AT_LEAST_0),
        ("huber_delta", "0", POSITIVE),
        ("max_grad_norm", "-1", POSITIVE),
        ("pool_size", "0", AT_LEAST_1),
        ("snapshot_interval", "0", AT_LEAST_1),
        ("random_opponent_prob", "-0.5", UNIT),
        ("opponent_epsilon", "2", UNIT),
    ],
    "maddpg": [
        ("critic_lr", "0", POSITIVE),
        ("buffer_size", "0", AT_LEAST_1),
        ("batch_size", "-1", AT_LEAST_1),
        ("learning_starts", "-1", AT_LEAST_0),
        ("train_freq", "0", AT_LEAST_1),
        ("tau", "0", RATE),
        ("tau", "2", RATE),
        ("max_grad_norm", "0", POSITIVE),
        ("noise_std", "-0.1", AT_LEAST_0),
        ("noise_std_final", "-1", AT_LEAST_0),
        ("epsilon", "1.1", UNIT),
        ("epsilon_final", "-0.1", UNIT),
        ("explore_decay_steps", "-1", AT_LEAST_0),
        ("lr_decay_steps", "-1", AT_LEAST_0),
        ("lr_final_frac", "1.5", UNIT),
        ("temperature", "0", POSITIVE),
        ("action_reg", "-1", AT_LEAST_0),
    ],
}
BAD = [
    *[(TINY, *case) for case in RUN_BAD],
    *[(algo, *case) for algo in sorted(ALGO_BAD) for case in [*SHARED_BAD, *ALGO_BAD[algo]]],
]


def _torch(algo: str) -> None:
    if algo in ALGORITHMS:
        pytest.importorskip("torch")


@pytest.mark.parametrize(("algo", "setting", "value", "limits"), BAD)
def test_a_setting_out_of_its_range_is_an_error_naming_it(
    algo: str, setting: str, value: str, limits: str
) -> None:
    _torch(algo)
    options = {"backend": "ray"}  # it takes every backend option
    message = f"{setting} must be {limits}, got {value}"  # the value as typed
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        load_config(algo, "corral/rps", {**options, setting: value})


@pytest.mark.parametrize(("algo", "setting", "value", "limits"), BAD)
def test_a_config_built_in_python_checks_its_ranges_too(
    algo: str, setting: str, value: str, limits: str
) -> None:
    _torch(algo)
    cls = RunConfig if (setting, value, limits) in RUN_BAD else algorithm_class(algo).Config
    typed = coerce(value, typing.get_type_hints(cls)[setting])
    with pytest.raises(ConfigError, match=f"{setting} must be"):
        cls(**{setting: typed})


@pytest.mark.parametrize(
    "argv",
    [
        ["mappo", "--set", "gamma=5"],
        ["dqn", "--set", "tau=0"],
        [TINY, "--total-steps", "-100"],
        [TINY, "--set", "eval_every=-1"],
    ],
)
def test_the_command_line_says_which_setting_is_out_of_range(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str]
) -> None:
    if argv[0] != TINY:
        pytest.importorskip("torch")
    code = cli.main(
        ["train", argv[0], "--env", "corral/rps", "--run-dir", str(tmp_path), *argv[1:]]
    )
    err = capsys.readouterr().err
    setting = argv[-1].split("=")[0] if "=" in argv[-1] else "total_steps"
    assert code == 2
    assert err.startswith(f"corral: error: {setting} must be ") and "Traceback" not in err
    assert not (tmp_path / "config.yaml").exists()


def test_a_value_out_of_range_in_a_run_config_names_the_file(tmp_path: Path) -> None:
    data = {"algo": TINY, "run": {"env": "corral/rps"}, "algo_config": {"gamma": 5}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(
        ConfigError, match=rf"^{tmp_path / 'config.yaml'}: gamma must be in \[0, 1\]"
    ):
        read_run_config(tmp_path, allow_imports=[TINY])


def test_the_bounds_themselves_are_accepted() -> None:
    pytest.importorskip("torch")
    edges = ["gamma=1", "tau=1", "learning_starts=0", "epsilon_end=0", "epsilon_decay_steps=0"]
    cfg = load_config("dqn", "corral/rps", [*edges, "eval_every=0", "checkpoint_every=0", "seed=0"])
    assert (cfg.algo_config.gamma, cfg.algo_config.tau, cfg.run.eval_every) == (1, 1, 0)
    assert load_config("mappo", "corral/rps", ["gae_lambda=0", "value_clip=none"]).algo_config


@pytest.mark.parametrize("algo", [None, *sorted(ALGORITHMS)])
def test_every_numeric_setting_declares_its_range(algo: str | None) -> None:
    _torch(str(algo))
    cls = RunConfig if algo is None else algorithm_class(algo).Config
    hints = typing.get_type_hints(cls)
    numeric = {f.name for f in dataclasses.fields(cls) if _is_numeric(hints[f.name])}
    assert numeric - set(declared_ranges(cls)) == set()  # unbounded: Range(), still finite


def _is_numeric(annotation: object) -> bool:
    if annotation in (int, float):
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, tuple):
        return any(_is_numeric(a) for a in typing.get_args(annotation))
    return False


def test_ranges_read_as_they_are_stated() -> None:
    assert [str(r) for r in (Range(ge=0, le=1), Range(gt=0, le=1), Range(ge=1), Range(gt=0))] == [
        "in [0, 1]",
        "in (0, 1]",
        "at least 1",
        "greater than 0",
    ]
    assert 0.5 in Range(ge=0, le=1) and 0 not in Range(gt=0) and float("nan") not in Range(ge=0)
    assert float("inf") not in Range(gt=0) and 10**400 in Range(ge=1)

    @dataclasses.dataclass
    class Sizes:
        hidden: typing.Annotated[tuple[int, ...], Range(ge=1)] = (4, 4)

    check_ranges(Sizes())
    with pytest.raises(
        ConfigError, match=r"every entry of hidden must be at least 1, got \(4, 0\)"
    ):
        check_ranges(Sizes((4, 0)))


# -- the timeout run setting ---------------------------------------------------------------------


def test_timeout_is_the_backend_s_and_0_sets_no_limit() -> None:
    def options(**settings: object) -> dict[str, object]:
        return load_config(
            TINY, "corral/rps", {"backend": "subproc", **settings}
        ).run.backend_options()

    assert options() == {}  # unset: the backend's default
    assert options(timeout=30) == {"timeout": 30.0}
    assert options(timeout=0) == {"timeout": None}  # the backend's "no limit"
    assert options(timeout="none") == {}
    ray = load_config(TINY, "corral/rps", {"backend": "ray", "start_timeout": 0})
    assert ray.run.backend_options() == {"start_timeout": None}


def test_timeout_reaches_the_training_envs_backend() -> None:
    cfg = load_config(TINY, "corral/rps", ["backend=subproc", "num_envs=1", "timeout=2.5"])
    venv = build_venv(cfg.run)
    try:
        assert venv._backend.timeout == 2.5
    finally:
        venv.close()


@pytest.mark.parametrize(
    ("setting", "debug", "on"),
    [(None, "0", False), (None, "1", True), ("true", "0", True), ("false", "1", False)],
)
def test_check_finite_reaches_the_training_envs_and_follows_debug_mode_unset(
    monkeypatch: pytest.MonkeyPatch, setting: str | None, debug: str, on: bool
) -> None:
    monkeypatch.setenv("CORRAL_DEBUG", debug)
    settings = ["num_envs=1"] + ([] if setting is None else [f"check_finite={setting}"])
    venv = build_venv(load_config(TINY, "corral/rps", settings).run)
    try:
        assert venv.check_finite is on
    finally:
        venv.close()


def test_timeout_is_no_option_of_the_sync_backend() -> None:
    with pytest.raises(ConfigError, match="timeout is an option of the subproc and ray backends"):
        load_config(TINY, "corral/rps", {"backend": "sync", "timeout": 5})


def test_a_run_config_that_says_worker_timeout_still_loads(tmp_path: Path) -> None:
    run = {"env": "corral/rps", "backend": "subproc", "worker_timeout": 7}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"algo": TINY, "run": run}))
    assert read_run_config(tmp_path, allow_imports=[TINY]).run.timeout == 7
    with pytest.raises(ConfigError, match="'worker_timeout' \\(did you mean 'timeout'\\?\\)"):
        load_config(TINY, "corral/rps", {"backend": "subproc", "worker_timeout": 7})


# -- the docstring of each setting ----------------------------------------------------------------


@dataclasses.dataclass
class _Base:
    rate: float = 0.1
    """Base rate."""
    size: int = 4
    """Rows of the table.

    A second paragraph.
    """


@dataclasses.dataclass
class _Derived(_Base):
    rate: float = 0.2
    """Derived rate."""
    undocumented: int = 0
    later: bool = True
    """Documented after a field without a docstring."""


def undocumented(cls: type) -> list[str]:
    """The fields of the dataclass ``cls`` that have no docstring (one each is required)."""
    docs = field_docs(cls)
    return [f.name for f in dataclasses.fields(cls) if not docs.get(f.name, "").strip()]


@pytest.mark.parametrize("algo", [None, *sorted(ALGORITHMS)])
def test_every_setting_has_a_docstring(algo: str | None) -> None:
    _torch(str(algo))
    cls = RunConfig if algo is None else algorithm_class(algo).Config
    assert undocumented(cls) == []


def test_a_setting_without_a_docstring_is_found() -> None:
    assert undocumented(_Derived) == ["undocumented"]


def test_field_docs_reads_each_field_s_docstring_inherited_and_overridden() -> None:
    assert field_docs(_Derived) == {
        "rate": "Derived rate.",  # the subclass's, not its base's
        "size": "Rows of the table.\n\nA second paragraph.",  # inherited, cleaned
        "later": "Documented after a field without a docstring.",
    }
    assert field_docs(_Base)["rate"] == "Base rate."
    pytest.importorskip("torch")
    mappo = algorithm_class("mappo").Config
    assert field_docs(mappo)["lr"] == "Adam learning rate of actor and critic."
    assert field_docs(mappo)["gamma"] == "Discount per decision of an agent."  # AlgoConfig's


def test_a_class_without_source_has_no_field_docs() -> None:
    built = dataclasses.make_dataclass("Built", [("x", int, 1)])
    assert field_docs(built) == {}


def test_a_sequence_setting_reads_empty_text_as_empty_and_brackets_as_a_list() -> None:
    assert coerce("", tuple[str, ...]) == ()
    assert coerce("a, b", tuple[str, ...]) == ("a", "b")
    assert coerce("[32, 32]", tuple[int, ...]) == (32, 32)
    assert coerce("(1, 2)", tuple[int, ...]) == (1, 2)


def test_start_timeout_is_the_rollout_workers_on_a_sync_run_with_runners() -> None:
    config = load_config("mappo", "corral/rps", {"runners": 2, "num_envs": 2, "start_timeout": 5})
    assert config.run.start_timeout == 5 and config.run.backend_options() == {}
    with pytest.raises(ConfigError, match="start_timeout is an option of the subproc and ray"):
        load_config("mappo", "corral/rps", {"start_timeout": 5})
