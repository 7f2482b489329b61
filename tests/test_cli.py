"""The ``corral`` command line: list, check and play, with clean errors and exit codes."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from support.cli import run
from support.plugins import installed_package, plugin_module

from corral import cli
from corral.env import MultiAgentEnv
from corral.registry import namespaces, register, registered_ids
from corral.settings import parse_value

pytestmark = pytest.mark.usefixtures("isolated_registry")

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def example() -> ModuleType:
    """``examples/custom_env.py``, imported by path."""
    spec = importlib.util.spec_from_file_location(
        "custom_env_for_cli", ROOT / "examples" / "custom_env.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def nim(example: ModuleType) -> str:
    register("test/nim", example.Nim)
    return "test/nim"


def test_list_prints_every_id_grouped_by_source(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "list")
    assert code == 0
    lines = {line.split("  (")[0].split("  [")[0] for line in out.splitlines()}
    for env_id in registered_ids():
        assert f"  {env_id}" in lines
        assert f"{env_id.split('/')[0]} (" in out
    for prefix in namespaces():
        assert f"{prefix}/<name>" in out


def test_list_a_source(capsys: pytest.CaptureFixture[str], nim: str) -> None:
    code, out, _ = run(capsys, "list", "test")
    assert code == 0
    assert out.splitlines() == ["test (1)", "  test/nim"]


def test_list_marks_natively_batched_ids(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(capsys, "list")
    lines = out.splitlines()
    assert "  mpe2/simple_spread_v3  (natively batched)" in lines
    assert "  corral/tag  (natively batched)" in lines
    assert "  corral/rps" in lines  # no native implementation: no mark


def test_list_unknown_source_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "list", "nosuchsource")
    assert code == 2
    assert out == ""
    assert "no env of source 'nosuchsource'" in err
    assert "Traceback" not in err


def test_list_marks_ids_whose_extra_is_missing(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, example: ModuleType
) -> None:
    monkeypatch.setattr(cli, "_extra_missing", lambda extra: extra == "fancy")
    register("test/fancy", example.Nim, extra="fancy")
    register("test/plain", example.Nim, extra="other")
    _, out, _ = run(capsys, "list", "test")
    assert "  test/fancy  [not installed: pip install 'corral[fancy]']" in out.splitlines()
    assert "  test/plain" in out.splitlines()


def test_extra_missing_reads_installed_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    requires = ['numpy>=1; extra == "fine"', 'not-a-real-dist-xyz>=1; extra == "fancy"']
    monkeypatch.setattr(cli.importlib.metadata, "requires", lambda name: requires)
    cli._extra_missing.cache_clear()
    try:
        assert cli._extra_missing("fancy") is True
        assert cli._extra_missing("fine") is False
        assert cli._extra_missing("unknown") is False
    finally:
        cli._extra_missing.cache_clear()


def test_an_extra_whose_requirement_has_extras_of_its_own_is_missing_with_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """corral[sisl] is pettingzoo[sisl]: pettingzoo installed without pymunk was listed as
    installed. The requirements of pettingzoo's own extra count, their markers evaluated."""
    pytest.importorskip("packaging")
    requires = {
        "corral": [
            'pettingzoo[sisl]>=1; extra == "sisl"',
            'pettingzoo>=1; extra == "pz"',
            'absent-xyz>=1; python_version < "3.1" and extra == "pz"',  # not this Python's
        ],
        "pettingzoo": ['pymunk-not-installed-xyz>=6; extra == "sisl"'],
    }
    monkeypatch.setattr(cli.importlib.metadata, "requires", lambda name: requires.get(name))
    real = cli.importlib.metadata.distribution
    monkeypatch.setattr(
        cli.importlib.metadata,
        "distribution",
        lambda name: real("numpy") if name == "pettingzoo" else real(name),
    )
    cli._extra_missing.cache_clear()
    try:
        assert cli._extra_missing("sisl") is True
        assert cli._extra_missing("pz") is False
    finally:
        cli._extra_missing.cache_clear()


def test_check_a_good_env_exits_0(capsys: pytest.CaptureFixture[str], nim: str) -> None:
    code, out, _ = run(capsys, "check", nim, "--seed", "3", "--steps", "50")
    assert code == 0
    assert out.startswith("test/nim (seed 3,")
    assert "ok, no contract violation found" in out


def test_check_that_ends_no_episode_exits_3_and_says_so(
    capsys: pytest.CaptureFixture[str], example: ModuleType
) -> None:
    register("test/long-nim", example.Nim, sticks=80, max_take=1)  # 80 steps an episode
    code, out, err = run(capsys, "check", "test/long-nim", "--steps", "20", "--step-cap", "50")
    assert code == 3
    assert "(seed 0, 50 steps, 0 episodes): incomplete, no contract violation found" in out
    assert "were not checked" in out and "Warning" not in err
    code, out, _ = run(capsys, "check", "test/long-nim", "--steps", "20")
    assert code == 0 and "(seed 0, 80 steps, 1 episodes): ok" in out


def test_check_a_broken_env_exits_1_with_the_violations(
    capsys: pytest.CaptureFixture[str], example: ModuleType
) -> None:
    class NaNReward(example.Nim):
        def step(self, actions: Any) -> Any:
            obs, rewards, terms, truncs, infos = super().step(actions)
            return obs, dict.fromkeys(rewards, float("nan")), terms, truncs, infos

    register("test/nan", NaNReward)
    code, out, _ = run(capsys, "check", "test/nan")
    assert code == 1
    assert re.search(r"- step 0: reward of agent 'player_\d' is nan", out)


def test_check_unknown_id_exits_2_with_a_suggestion(
    capsys: pytest.CaptureFixture[str], nim: str
) -> None:
    code, out, err = run(capsys, "check", "test/nmi")
    assert code == 2
    assert out == ""
    assert "unknown env id 'test/nmi'" in err
    assert "Did you mean test/nim" in err
    assert "Traceback" not in err


def test_check_missing_dependency_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    register("test/needs-fancy", "fancy_sim_not_installed:Env", extra="fancy")
    code, _, err = run(capsys, "check", "test/needs-fancy")
    assert code == 2
    assert "pip install 'corral[fancy]'" in err


def test_bad_kwargs_exit_2(capsys: pytest.CaptureFixture[str], nim: str) -> None:
    code, _, err = run(capsys, "check", nim, "--set", "no_such_option=1")
    assert code == 2
    assert "cannot build 'test/nim' with {'no_such_option': 1}" in err
    code, _, err = run(capsys, "play", nim, "--set", "sticks")
    assert code == 2
    assert "expected KEY=VALUE" in err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["check", "ID", "--steps", "-5"], "argument --steps: must be at least 1, got -5"),
        (["check", "ID", "--episodes", "0"], "argument --episodes: must be at least 1, got 0"),
        (["check", "ID", "--step-cap", "0"], "argument --step-cap: must be at least 1, got 0"),
        (["check", "ID", "--num-envs", "0"], "argument --num-envs: must be at least 1, got 0"),
        (["check", "ID", "--seed", "-1"], "argument --seed: must be at least 0, got -1"),
        (["check", "ID", "--seed", "x"], "argument --seed: expected an integer, got 'x'"),
        (
            ["check", "ID", "--timeout", "0"],
            "argument --timeout: expected a positive number of seconds, got '0'",
        ),
        (
            ["check", "ID", "--timeout", "inf"],
            "argument --timeout: expected a positive number of seconds, got 'inf'",
        ),
        (["play", "ID", "--episodes", "-1"], "argument --episodes: must be at least 1, got -1"),
        (["play", "ID", "--max-steps", "0"], "argument --max-steps: must be at least 1, got 0"),
        (["play", "ID", "--seed", "-3"], "argument --seed: must be at least 0, got -3"),
        (["eval", "RUN", "--episodes", "0"], "argument --episodes: must be at least 1, got 0"),
        (
            ["eval", "RUN", "--seed", "-1"],
            "argument --seed: must be in [0, 18446744073709551615], got -1",
        ),
    ],
)
def test_a_number_out_of_its_range_exits_2_naming_the_argument(
    capsys: pytest.CaptureFixture[str], nim: str, argv: list[str], expected: str
) -> None:
    argv = [nim if a == "ID" else a for a in argv]
    with pytest.raises(SystemExit) as exit:
        cli.main(argv)
    assert exit.value.code == 2
    assert expected in capsys.readouterr().err


def test_module_attr_id_from_the_current_directory(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(ROOT))])
    try:
        code, out, _ = run(capsys, "check", "examples.custom_env:Nim", "--kwargs", "sticks=4")
    finally:
        sys.modules.pop("examples.custom_env", None)
        sys.modules.pop("examples", None)
    assert code == 0, out
    assert out.startswith("examples.custom_env:Nim (")


def user_module(directory: Path) -> str:
    """A module of the user's in ``directory``, of a new name ``NAME``, that registers the
    id ``NAME/rps`` when imported."""
    name = f"mine_{uuid.uuid4().hex[:10]}"
    (directory / f"{name}.py").write_text(
        "import corral\n\n"
        f"corral.register('{name}/rps', 'corral.envs.rps:RockPaperScissors', num_rounds=2)\n"
    )
    return name


@pytest.fixture
def in_tmp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``tmp_path`` as the current directory, not on ``sys.path``."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    return tmp_path


def test_import_makes_a_module_s_ids_known_to_list_check_and_play(
    capsys: pytest.CaptureFixture[str], in_tmp_dir: Path
) -> None:
    module = source = user_module(in_tmp_dir)
    try:
        code, _, err = run(capsys, "check", f"{source}/rps")
        assert code == 2 and f"No env of source '{source}' is registered" in err
        assert "--import MODULE" in err
        code, out, err = run(capsys, "list", source, "--import", module)
        assert code == 0 and f"  {source}/rps" in out.splitlines(), err
        code, out, err = run(capsys, "check", f"{source}/rps", "--import", module)
        assert code == 0 and out.startswith(f"{source}/rps ("), err
        code, out, err = run(capsys, "play", f"{source}/rps", "--import", module, "--episodes", "1")
        assert code == 0 and out.startswith("episode 0: length 4,"), err  # 2 rounds, 2 turns
    finally:
        sys.modules.pop(module, None)


def test_list_and_check_know_an_installed_package_s_ids_without_import(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = f"plug{uuid.uuid4().hex[:8]}"
    module = f"{source}_envs"
    installed_package(tmp_path, {source: module}, {module: plugin_module(source)})
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        code, out, err = run(capsys, "check", f"{source}/rps")  # loaded on the first miss
        assert code == 0 and out.startswith(f"{source}/rps ("), err
        code, out, err = run(capsys, "list", source)
        assert code == 0 and out.splitlines() == [f"{source} (1)", f"  {source}/rps"], err
    finally:
        sys.modules.pop(module, None)


def test_a_package_whose_entry_point_cannot_be_loaded_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    installed_package(tmp_path, {"broken": "no_such_plugin_module_xyz"}, {})
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out, err = run(capsys, "list")
    assert (code, out) == (2, "")
    assert len(err.splitlines()) == 1
    assert err.startswith("corral: error: the entry point 'broken = no_such_plugin_module_xyz'")


def test_an_import_that_fails_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "check", "corral/rps", "--import", "no_such_module_xyz")
    assert (code, out) == (2, "")
    assert err == (
        "corral: error: cannot import the module 'no_such_module_xyz': "
        "No module named 'no_such_module_xyz'\n"
    )


@pytest.mark.parametrize("command", ["check", "play"])
@pytest.mark.parametrize(
    ("env_id", "suggestion"),
    [("gym/CartPol-v1", "gym/CartPole-v1"), ("openspiel/kuhn_pokr", "openspiel/kuhn_poker")],
)
def test_a_misspelt_namespace_id_is_one_line_with_a_suggestion(
    capsys: pytest.CaptureFixture[str], command: str, env_id: str, suggestion: str
) -> None:
    if env_id.startswith("openspiel/"):
        pytest.importorskip("pyspiel")
    code, out, err = run(capsys, command, env_id)
    assert (code, out) == (2, "")
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"corral: error: unknown env id '{env_id}'")
    assert f"Did you mean {suggestion}" in err


class Refusing(MultiAgentEnv):
    """An env whose constructor refuses its argument."""

    def __init__(self, size: int = 1) -> None:
        if size < 2:
            raise ValueError(f"size must be at least 2,\ngot {size}")


@pytest.mark.parametrize("command", ["check", "play"])
def test_a_constructor_that_raises_is_one_line(
    capsys: pytest.CaptureFixture[str], command: str
) -> None:
    register("test/refusing", Refusing)
    code, out, err = run(capsys, command, "test/refusing", "--set", "size=0")
    assert (code, out) == (2, "")
    assert len(err.splitlines()) == 1, err
    assert err.startswith(
        "corral: error: cannot build 'test/refusing' with {'size': 0}: ValueError: size must be "
        f"at least 2, got 0 (raised at {__file__}:"
    )


def _faulty_nim(example: ModuleType, fault: str, at: str) -> type:
    """``Nim`` that hangs, ends its process (code 3) or is killed (SIGKILL) in ``at``."""

    def act() -> None:
        if fault == "hang":
            time.sleep(600)
        elif fault == "exit":
            os._exit(3)
        else:
            os.kill(os.getpid(), signal.SIGKILL)

    class Faulty(example.Nim):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            if at == "init":
                act()

        def reset(self, seed=None, options=None):
            if at == "reset":
                act()
            return super().reset(seed=seed, options=options)

        def step(self, actions):
            if at == "step":
                act()
            return super().step(actions)

    return Faulty


@pytest.mark.parametrize(
    ("fault", "at", "says"),
    [
        ("hang", "step", "the env hung for more than 0.5 s at step 0: env.step (dict env)"),
        ("hang", "init", "the env hung for more than 0.5 s at building the env (dict env)"),
        (
            "exit",
            "reset",
            "the env's process exited with code 3 at reset: env.reset(seed=0) (dict env)",
        ),
        ("kill", "step", "the env's process was killed by signal 9 at step 0: env.step (dict env)"),
    ],
)
def test_an_env_that_hangs_or_ends_its_process_is_one_line_and_exits_1(
    capsys: pytest.CaptureFixture[str], example: ModuleType, fault: str, at: str, says: str
) -> None:
    # the check runs in a child process: before, a hang hung corral check for good, and an
    # os._exit ended it with that code and no message
    register("test/faulty", _faulty_nim(example, fault, at))
    started = time.monotonic()
    code, out, err = run(capsys, "check", "test/faulty", "--timeout", "0.5")
    assert code == 1, (out, err)
    assert out.splitlines() == [f"test/faulty: {says}; " + (
        "the check stopped it (--timeout sets the limit)" if fault == "hang"
        else "the check stopped there"
    )]  # fmt: skip
    assert err == ""
    assert time.monotonic() - started < 30


def test_a_hang_in_a_batched_env_names_its_implementation(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(ROOT))
    from examples.batched_env import BatchedNim

    class Stuck(BatchedNim):
        def step(self, actions):
            time.sleep(600)

    register("test/stuck", batched=Stuck)
    code, out, _ = run(capsys, "check", "test/stuck", "--timeout", "0.5")
    assert code == 1
    assert out.splitlines() == [
        "test/stuck: the env hung for more than 0.5 s at step 0: env.step (batched env, "
        "numpy); the check stopped it (--timeout sets the limit)"
    ]


def test_a_module_attr_whose_import_hangs_is_stopped_at_the_timeout(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The id's code was imported in corral check's own process, where no timeout held."""
    module = f"hangs_on_import_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text("import time\ntime.sleep(600)\nEnv = None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    started = time.monotonic()
    code, out, _ = run(capsys, "check", f"{module}:Env", "--timeout", "0.5")
    assert code == 1
    assert out.splitlines() == [
        f"{module}:Env: the env hung for more than 0.5 s at importing the code of "
        f"{module}:Env; the check stopped it (--timeout sets the limit)"
    ]
    assert time.monotonic() - started < 30 and module not in sys.modules


def test_parse_kwargs_reads_the_settings_grammar() -> None:
    parsed = cli.parse_kwargs(
        ["n=3", "ratio=0.5", "flag=True", "size=(2, 3)", "mode=fast", "s=", "off=false"]
    )
    assert parsed == {
        "n": 3,
        "ratio": 0.5,
        "flag": True,
        "size": (2, 3),
        "mode": "fast",
        "s": "",
        "off": False,
    }
    with pytest.raises(cli.UsageError, match="KEY=VALUE"):
        cli.parse_kwargs(["1x=2"])


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("false", False),
        ("FALSE", False),
        ("true", True),
        ("None", None),
        ("null", None),
        ("~", None),
        ("-3", -3),
        ("1_000", 1000),
        ("1e-3", 0.001),
        ("[1, 2]", [1, 2]),
        ("[a, b]", ["a", "b"]),
        ("{a: 1, b: null}", {"a": 1, "b": None}),
        ("'3'", "3"),
        ('"false"', "false"),
        ("yes", "yes"),
        ("mpe2/simple_v3", "mpe2/simple_v3"),
        ("pkg.mod:Policy", "pkg.mod:Policy"),
        ("__import__('os')", "__import__('os')"),  # parsed, never run
    ],
)
def test_a_setting_reads_as_yaml_with_python_spellings(text: str, value: Any) -> None:
    parsed = parse_value(text)
    assert parsed == value and type(parsed) is type(value)


@pytest.mark.parametrize(
    ("item", "says"),
    [
        ("novalue", "got 'novalue': setting 'novalue' has no value"),
        ("=3", "got '=3': the setting's name is missing"),
        ("1x=2", "'1x' is not a name"),
    ],
)
@pytest.mark.parametrize("command", ["check", "play"])
def test_a_setting_that_is_not_key_value_exits_2_naming_it(
    capsys: pytest.CaptureFixture[str], nim: str, command: str, item: str, says: str
) -> None:
    code, out, err = run(capsys, command, nim, "--set", item)
    assert code == 2 and out == ""
    assert "corral: error: expected KEY=VALUE" in err and says in err


@pytest.mark.parametrize("command", ["check", "play"])
def test_set_values_reach_the_env_typed(
    capsys: pytest.CaptureFixture[str], example: ModuleType, command: str, tmp_path: Path
) -> None:
    seen = tmp_path / "seen.txt"  # check builds its env in a child process: a file tells

    def recorded(**kwargs: Any) -> Any:
        with seen.open("a") as file:
            file.write(repr(kwargs) + "\n")
        return example.Nim(sticks=3)

    register("test/recorded", recorded)
    argv = ["--set", "flag=false", "x=None", "on=true", "name='3'", "sizes=[2, 3]"]
    code, _, err = run(capsys, command, "test/recorded", *argv)
    assert code == 0, err
    expected = {"flag": False, "x": None, "on": True, "name": "3", "sizes": [2, 3]}
    assert seen.read_text().splitlines() == [repr(expected)]


def test_play_prints_each_episode_and_the_mean(
    capsys: pytest.CaptureFixture[str], nim: str
) -> None:
    code, out, _ = run(capsys, "play", nim, "--episodes", "3", "--seed", "1", "--set", "sticks=5")
    assert code == 0
    lines = out.splitlines()
    assert len(lines) == 4
    for i, line in enumerate(lines[:3]):
        match = re.fullmatch(
            rf"episode {i}: length (\d), returns player_0=([+-]\d), player_1=([+-]\d)", line
        )
        assert match, line
        length, first, second = map(int, match.groups())
        assert 2 <= length <= 5  # 5 sticks, 1 to 3 taken per turn
        assert {first, second} == {1, -1}
    assert lines[3].startswith("mean returns over 3 episode(s): player_0=")


def test_play_stops_an_endless_episode(capsys: pytest.CaptureFixture[str], nim: str) -> None:
    code, out, _ = run(capsys, "play", nim, "--episodes", "1", "--max-steps", "1")
    assert code == 0
    assert "episode 0: length 1," in out
    assert "(stopped: still running after 1 steps)" in out


def test_python_dash_m_corral() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "corral", "list", "corral"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "  corral/rps" in done.stdout.splitlines()
    missing = subprocess.run(
        [sys.executable, "-m", "corral", "check", "corral/nope"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert missing.returncode == 2
    assert missing.stderr.startswith("corral: error: unknown env id 'corral/nope'")
    assert "Traceback" not in missing.stderr


def test_output_cut_short_by_its_reader_ends_quietly() -> None:
    # `corral list | head -1`, made deterministic: the reader has gone before anything is
    # written, so the first write (or the final flush) meets a closed pipe.
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "corral", "list"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write)
    assert done.stderr == ""
    assert done.returncode == cli.BROKEN_PIPE


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "mappo", "--env", "corral/rps", "--envs", "8"],  # not --envs-per-runner
        ["check", "corral/rps", "--step", "5"],  # not --steps
    ],
)
def test_a_flag_abbreviated_is_refused_not_taken_for_the_longer_one(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli._parser().parse_args(argv)
    assert exited.value.code == 2
    assert "unrecognized arguments" in capsys.readouterr().err


def test_the_custom_env_guide_s_self_play_command_trains(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """docs/custom_env.md trains its Nim with --self-play, which needs metadata zero_sum: the
    example did not declare it, and the guide's command exited 2."""
    pytest.importorskip("torch")
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(ROOT))])
    command = ["train", "dqn", "--env", "examples.custom_env:Nim", "--self-play"]
    command += ["--set", "env_kwargs.sticks=7", "--total-steps", "600", "--no-progress"]
    command += ["--run-dir", str(tmp_path / "nim"), "--set", "eval_episodes=4", "device=cpu"]
    try:
        code, _, err = run(capsys, *command)
    finally:
        sys.modules.pop("examples.custom_env", None)
        sys.modules.pop("examples", None)
    assert code == 0, err
    guide = (ROOT / "docs" / "custom_env.md").read_text()
    assert "--env examples.custom_env:Nim --self-play" in guide  # the command this runs


def test_the_help_lists_every_registered_algorithm(capsys: pytest.CaptureFixture[str]) -> None:
    from corral.algos import ALGORITHMS

    code, said, _ = run(capsys, "train", "--help")
    assert code == 0
    assert all(name in said for name in ALGORITHMS) and "qmix" in said
