"""Checkpoint files: what they hold and give back exactly, that loading one runs no code, that
damage and old or foreign files give one clear error, atomic and wall-clock checkpoints."""

from __future__ import annotations

import io
import json
import os
import pickle
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from collections import OrderedDict, defaultdict, namedtuple
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("yaml")
torch = pytest.importorskip("torch")

from support.checkpoints import members, rewrite  # noqa: E402
from support.paths import ROOT  # noqa: E402
from support.tabular import TabularQ  # noqa: E402

import corral  # noqa: E402
from corral import cli  # noqa: E402
from corral.algos.dqn import DQN  # noqa: E402
from corral.algos.maddpg import MADDPG  # noqa: E402
from corral.algos.mappo import IPPO, MAPPO  # noqa: E402
from corral.errors import CheckpointError, MissingDependencyError  # noqa: E402
from corral.training import ConfigError, Runner, load_config, load_run  # noqa: E402
from corral.training import checkpoint as ckpt  # noqa: E402
from corral.training.collector import Collector  # noqa: E402
from corral.training.metrics import read_metrics  # noqa: E402
from corral.training.runner import BEST, LATEST, load_players, player_states  # noqa: E402
from corral.training.self_play import self_play  # noqa: E402


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def assert_identical(a: Any, b: Any, where: str = "checkpoint") -> None:
    """``a`` and ``b`` hold the same values of the same types, down to every bit."""
    assert type(a) is type(b), f"{where}: {type(a)} != {type(b)}"
    if isinstance(a, dict):
        assert list(a) == list(b) and list(map(type, a)) == list(map(type, b)), where
        for key in a:
            assert_identical(a[key], b[key], f"{where}[{key!r}]")
        assert getattr(a, "_metadata", None) == getattr(b, "_metadata", None), where
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_identical(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and b.device.type == "cpu", where
        bits = [t.cpu().contiguous().reshape(-1).view(torch.uint8) for t in (a, b)]
        assert torch.equal(*bits), where
    elif isinstance(a, (np.ndarray, np.generic)):
        assert a.dtype == b.dtype and np.shape(a) == np.shape(b), where
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes(), where
    elif isinstance(a, float):
        assert a.hex() == b.hex() or (a != a and b != b), where
    else:
        assert a == b, where


def round_trip(tmp_path: Path, value: dict[str, Any]) -> dict[str, Any]:
    ckpt.save(tmp_path / "x.pt", value)
    return ckpt.load(tmp_path / "x.pt")


# -- what a checkpoint holds -----------------------------------------------------------------


def test_plain_data_tensors_and_arrays_come_back_with_their_types(tmp_path: Path) -> None:
    net = torch.nn.Linear(3, 2)
    value = {
        "tuple": (1, (2.5, None), "x", True),
        "int keys": {0: "a", -3: "b", (1, "t"): [1, 2], 2.5: None, None: 1, True: 0},
        "tag as a key": {"__corral__": "tuple", "items": 3},
        "floats": [float("nan"), -0.0, float("inf"), 1e-310, 0.1],
        "big": 2**127 + 1,
        "numpy scalars": [np.float32(1.5), np.int8(-3), np.uint64(2**64 - 1), np.bool_(True)],
        "other scalars": [np.longdouble(1.1), np.str_("hi"), np.complex64(1 + 2j)],
        "arrays": [np.arange(12.0).reshape(3, 4).T, np.zeros((0, 2), np.int16), np.array("s")],
        "tensors": [torch.arange(6).reshape(2, 3)[:, 1], torch.zeros(2, dtype=torch.bfloat16)],
        "module": net.state_dict(),
        "ordered": OrderedDict([("b", 1), ("a", 2)]),
    }
    assert_identical(value, round_trip(tmp_path, value))


def test_global_generators_resume_where_they_were(tmp_path: Path) -> None:
    ckpt.seed_everything(3)
    random.random(), np.random.normal(), torch.rand(2)  # moves each generator
    state = round_trip(tmp_path, {"rng": ckpt.rng_state()})["rng"]
    assert isinstance(state["python"], tuple) and isinstance(state["numpy"], tuple)
    expected = (random.random(), np.random.normal(), torch.rand(2))
    ckpt.set_rng_state(state)
    again = (random.random(), np.random.normal(), torch.rand(2))
    assert expected[:2] == again[:2] and torch.equal(expected[2], again[2])


def _collector(venv: Any, algo: Any, seed: int) -> Collector:
    """A collector of ``algo``, in self-play where its config says so."""
    players = self_play(venv, algo) if getattr(algo.config, "self_play", False) else {}
    return Collector(venv, algo, seed=seed, **players)


def _mappo(**config: Any) -> Collector:
    venv = corral.make_vec("corral/rps", 4, seed=0, state=True)
    algo = MAPPO(venv, MAPPO.Config(rollout_steps=4, epochs=1, minibatches=2, **config))
    collector = _collector(venv, algo, seed=0)
    collector.run(4 * 13)  # updates and a partial rollout
    return collector


def _ippo() -> Collector:
    venv = corral.make_vec("corral/rps", 4, seed=0)
    collector = _collector(venv, IPPO(venv, IPPO.Config(rollout_steps=4, epochs=1)), seed=0)
    collector.run(4 * 9)
    return collector


def _maddpg() -> Collector:
    venv = corral.make_vec("mdp/two_round_dmdp", 8, seed=1)
    algo = MADDPG(venv, MADDPG.Config(hidden=(16,), batch_size=32, learning_starts=64))
    collector = _collector(venv, algo, seed=1)
    collector.run(160)
    return collector


def _dqn(**config: Any) -> Collector:
    venv = corral.make_vec("corral/rps", 4, seed=0)
    settings = {"hidden": (16,), "learning_starts": 40, "train_freq": 4, **config}
    collector = _collector(venv, DQN(venv, DQN.Config(batch_size=16, **settings)), seed=0)
    collector.run(160)
    return collector


ALGORITHMS: dict[str, Callable[[], Any]] = {
    "mappo": _mappo,
    "mappo self-play": lambda: _mappo(self_play=True, snapshot_interval=1),
    "ippo": _ippo,
    "maddpg": _maddpg,
    "dqn": _dqn,
    "dqn self-play": lambda: _dqn(self_play=True, snapshot_interval=8),
}


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_every_algorithm_s_state_round_trips_exactly(tmp_path: Path, name: str) -> None:
    collector = ALGORITHMS[name]()
    algo = collector.algo

    def state_of() -> dict[str, Any]:  # what a checkpoint holds of the learner and its players
        seating = collector.seating
        return {
            "algo_state": algo.state_dict(),
            "replay": algo.replay_state_dict(),
            "players": player_states(collector),
            "seating": None if seating is None else seating.state_dict(),
        }

    state = state_of()
    assert bool(state["players"]) == ("self-play" in name)
    loaded = round_trip(tmp_path, state)
    assert_identical(state, loaded)
    algo.load_state_dict(loaded["algo_state"])
    if loaded["replay"] is not None:
        algo.load_replay_state_dict(loaded["replay"])
    load_players(collector, loaded)
    again = state_of()
    if state["seating"] is not None:  # every env begins an episode, numbered on from there
        begun = [k + 1 for k in state["seating"]["episode"]]
        assert again.pop("seating") == {"episode": begun} and state.pop("seating")
    assert_identical(state, again)


Point = namedtuple("Point", "x y")


@pytest.mark.parametrize(
    ("value", "where", "what"),
    [
        ({"a": [1, {"b": object()}]}, r"checkpoint\['a'\]\[1\]\['b'\]", "builtins.object"),
        ({"s": {1, 2}}, r"checkpoint\['s'\]", "builtins.set"),
        ({"p": Point(1, 2)}, r"checkpoint\['p'\]", "Point"),
        ({"d": defaultdict(int)}, r"checkpoint\['d'\]", "defaultdict"),
        ({"b": b"bytes"}, r"checkpoint\['b'\]", "bytes"),
        ({"o": np.array([1, None], dtype=object)}, r"checkpoint\['o'\]", "Python objects"),
        ({"k": {(1, torch.zeros(1)): 2}}, r"a key of checkpoint\['k'\]", "torch.Tensor"),
        ({"f": {"g": np.float64}}, r"checkpoint\['f'\]\['g'\]", "type"),
    ],
)
def test_a_value_a_checkpoint_cannot_hold_fails_at_save_naming_where(
    tmp_path: Path, value: dict, where: str, what: str
) -> None:
    ckpt.save(tmp_path / LATEST, {"ok": 1})
    with pytest.raises(CheckpointError, match=f"cannot save {where}: .*{what}"):
        ckpt.save(tmp_path / LATEST, value)
    assert ckpt.load(tmp_path / LATEST) == {"ok": 1}
    assert os.listdir(tmp_path) == [LATEST]


# -- loading runs no code --------------------------------------------------------------------


class Payload:
    """Unpickling it creates the directory ``marker``: code run by whoever loads it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.mkdir, (str(self.marker),))


def old_checkpoint(path: Path, checkpoint: dict[str, Any], *, with_torch: bool = True) -> None:
    """Write ``checkpoint`` as corral did up to aca5385: ``torch.save``, or a pickle."""
    if with_torch:
        torch.save(checkpoint, path)
    else:
        with open(path, "wb") as file:
            pickle.dump(checkpoint, file, protocol=pickle.HIGHEST_PROTOCOL)


def test_the_payload_runs_code_when_unpickled(tmp_path: Path) -> None:
    """The check that the tests below would see a payload run."""
    marker = tmp_path / "ran"
    pickle.loads(pickle.dumps({"x": Payload(marker)}))
    assert marker.exists()


@pytest.mark.parametrize("with_torch", [True, False])
def test_an_old_checkpoint_is_refused_unread_saying_what_to_do(
    tmp_path: Path, with_torch: bool
) -> None:
    marker = tmp_path / "ran"
    old_checkpoint(tmp_path / LATEST, {"env_steps": 3, "x": Payload(marker)}, with_torch=with_torch)
    with pytest.raises(
        CheckpointError, match=r"older corral.*does not load pickled.*train the run"
    ):
        ckpt.load(tmp_path / LATEST)
    assert not marker.exists()


def genuine(path: Path) -> dict[str, bytes]:
    ckpt.save(path, {"w": torch.ones(3), "a": np.arange(4), "n": 1})
    return members(path)


def evil_tensors(marker: Path) -> bytes:
    file = io.BytesIO()
    torch.save({"0": Payload(marker)}, file)
    return file.getvalue()


def object_array(item: Any) -> bytes:
    file = io.BytesIO()
    np.lib.format.write_array(file, np.array([item], dtype=object), allow_pickle=True)
    return file.getvalue()


def forged(path: Path, marker: Path) -> list[dict[str, bytes]]:
    """Checkpoints with a valid checksum that a crafter made to run ``Payload``."""
    parts = genuine(path)
    meta = json.loads(parts["meta.json"])
    extra_key = {**meta, "data": {**meta["data"], "evil": {"__corral__": "pickle", "x": 1}}}
    pickled = pickle.dumps(Payload(marker))
    return [
        {**parts, "tensors.pt": evil_tensors(marker)},
        {**parts, "evil.pkl": pickled},
        {**parts, "arrays/0.npy": object_array(Payload(marker))},
        {**parts, "meta.json": json.dumps(extra_key).encode()},
    ]


def test_an_array_whose_header_declares_more_than_its_member_holds_is_refused(
    tmp_path: Path,
) -> None:
    parts = genuine(tmp_path / "x.pt")
    huge = io.BytesIO()  # the header of 2**40 float64 (8 TiB) before 8 bytes of data
    header = {"descr": "<f8", "fortran_order": False, "shape": (2**40,)}
    np.lib.format.write_array_header_1_0(huge, header)
    rewrite(tmp_path / "x.pt", {**parts, "arrays/0.npy": huge.getvalue() + bytes(8)})
    with pytest.raises(CheckpointError, match=r"arrays/0.npy declares an array of shape"):
        ckpt.load(tmp_path / "x.pt")


def test_a_forged_checkpoint_runs_no_code(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    for i, parts in enumerate(forged(tmp_path / "x.pt", marker)):
        rewrite(tmp_path / "x.pt", parts)
        with pytest.raises(CheckpointError, match=re.escape(str(tmp_path / "x.pt"))):
            ckpt.load(tmp_path / "x.pt")
        assert not marker.exists(), i


def test_tensors_that_torch_refuses_are_one_error_line_naming_the_object(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "ran"
    rewrite(tmp_path / "x.pt", {**genuine(tmp_path / "x.pt"), "tensors.pt": evil_tensors(marker)})
    with pytest.raises(CheckpointError) as error:
        ckpt.load(tmp_path / "x.pt")
    message = str(error.value)
    assert message == (
        f"{tmp_path / 'x.pt'}: its tensors.pt holds the Python object posix.mkdir besides "
        "tensors, which corral does not load (loading it could run code): corral did not write it"
    )
    assert not marker.exists()


@pytest.mark.parametrize(
    ("version", "safe"),
    [("2.5.1", False), ("2.1.0+cpu", False), ("2.6.0", True), ("2.10.0+cu128", True)],
)
def test_a_torch_whose_weights_only_loader_can_run_code_loads_no_tensors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str, safe: bool
) -> None:
    ckpt.save(tmp_path / "x.pt", {"w": torch.ones(3)})
    monkeypatch.setattr(torch, "__version__", version)
    if safe:
        assert torch.equal(ckpt.load(tmp_path / "x.pt")["w"], torch.ones(3))
        return
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load was called"))
    with pytest.raises(
        MissingDependencyError, match=f"torch {re.escape(version)} cannot load them safely"
    ):
        ckpt.load(tmp_path / "x.pt")
    ckpt.save(tmp_path / "y.pt", {"a": np.arange(3), "n": 1})  # no tensors: nothing to refuse
    assert ckpt.load(tmp_path / "y.pt")["n"] == 1


def test_a_genuine_checkpoint_with_an_extra_tensor_loads_as_data(tmp_path: Path) -> None:
    parts = genuine(tmp_path / "x.pt")
    extra = io.BytesIO()
    torch.save({"0": torch.ones(3), "1": torch.zeros(2)}, extra)
    rewrite(tmp_path / "x.pt", {**parts, "tensors.pt": extra.getvalue()})
    assert torch.equal(ckpt.load(tmp_path / "x.pt")["w"], torch.ones(3))


@pytest.fixture(scope="module")
def dqn_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished DQN run (a registered algorithm, as ``corral eval`` runs it)."""
    run_dir = tmp_path_factory.mktemp("runs") / "dqn"
    settings = {
        "num_envs": 2,
        "total_steps": 40,
        "eval_every": 20,
        "eval_episodes": 2,
        "log_every": 20,
        "learning_starts": 20,
        "batch_size": 8,
        "device": "cpu",
        "tensorboard": False,
        "run_dir": str(run_dir),
    }
    with Runner(load_config("dqn", "mdp/climbing", settings), progress=False) as runner:
        runner.train()
    return run_dir


@pytest.mark.parametrize("kind", ["old", "forged"])
@pytest.mark.parametrize("command", ["eval", "resume"])
def test_the_cli_refuses_a_crafted_checkpoint_without_running_it(
    dqn_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, kind: str
) -> None:
    run_dir = shutil.copytree(dqn_run, tmp_path / "run")
    marker = tmp_path / "ran"
    target = run_dir / (BEST if command == "eval" else LATEST)
    if kind == "old":
        old_checkpoint(target, {"algo_state": Payload(marker), "env_steps": 1})
        said = f"{target} cannot be loaded: it was written by an older corral"
    else:  # the genuine checkpoint with a payload among its tensors, sealed again
        tensors = torch.load(io.BytesIO(members(target)["tensors.pt"]), weights_only=True)
        forged_tensors = io.BytesIO()
        torch.save({**tensors, "extra": Payload(marker)}, forged_tensors)
        rewrite(target, {**members(target), "tensors.pt": forged_tensors.getvalue()})
        said = f"{target}: its tensors.pt holds the Python object posix.mkdir besides tensors"
    argv = ["eval", str(run_dir)]
    if command == "resume":
        argv = ["train", "--resume", str(run_dir), "--no-progress"]
    code = cli.main(argv)
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(lines) == 1 and lines[0].startswith(f"corral: error: {said}"), lines
    assert not marker.exists()


def test_a_reference_opponent_loads_through_the_same_checks(dqn_run: Path, tmp_path: Path):
    run_dir = shutil.copytree(dqn_run, tmp_path / "run")
    marker = tmp_path / "ran"
    old_checkpoint(run_dir / BEST, {"algo_state": Payload(marker), "env_steps": 1})
    with pytest.raises(CheckpointError, match="older corral"):
        load_run(run_dir)
    assert not marker.exists()


# -- damaged, old and foreign files ----------------------------------------------------------


def offsets_of(path: Path) -> dict[str, int]:
    """Where each member's data and the zip's central directory start in ``path``."""
    found = {}
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            with archive.open(info) as member:
                member.read(1)
            found[info.filename] = info.header_offset + 30 + len(info.filename) + len(info.extra)
        found["central directory"] = archive.start_dir
    return found


def test_a_checkpoint_with_16_bytes_overwritten_anywhere_is_refused(tmp_path: Path) -> None:
    path = tmp_path / LATEST
    algo = _dqn().algo
    ckpt.save(path, {"algo_state": algo.state_dict(), "replay": algo.replay_state_dict()})
    data = path.read_bytes()
    named = offsets_of(path)
    starts = [0, *named.values(), named["meta.json"] + 40, named["tensors.pt"] + 900]
    starts += [len(data) - 16, len(data) - 40, *range(0, len(data) - 16, 997)]
    for start in starts:
        damaged = bytearray(data)
        damaged[start : start + 16] = bytes(b ^ 0x5A for b in damaged[start : start + 16])
        path.write_bytes(bytes(damaged))
        with pytest.raises(CheckpointError, match=f"{re.escape(str(path))} .*damaged") as error:
            ckpt.load(path)
        assert "checksum" in str(error.value) or "truncated" in str(error.value), start


@pytest.mark.parametrize("damage", ["16 bytes overwritten", "cut in half"])
@pytest.mark.parametrize("command", ["eval", "resume"])
def test_the_cli_refuses_a_damaged_checkpoint_in_one_line(
    dqn_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, damage: str
) -> None:
    run_dir = shutil.copytree(dqn_run, tmp_path / "run")
    target = run_dir / (BEST if command == "eval" else LATEST)
    data = bytearray(target.read_bytes())
    middle = len(data) // 2
    if damage == "cut in half":
        del data[middle:]
        said = f"{target} cannot be loaded: it is truncated or damaged"
    else:
        data[middle : middle + 16] = bytes(b ^ 0x5A for b in data[middle : middle + 16])
        said = f"{target} is damaged: its sha256 checksum does not match its contents"
    target.write_bytes(bytes(data))
    argv = ["eval", str(run_dir)]
    if command == "resume":
        argv = ["train", "--resume", str(run_dir), "--no-progress"]
    code = cli.main(argv)
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(lines) == 1 and lines[0].startswith(f"corral: error: {said}"), lines


def test_a_truncated_checkpoint_is_refused(tmp_path: Path) -> None:
    path = tmp_path / LATEST
    ckpt.save(path, {"w": torch.ones(3), "a": np.arange(4)})
    data = path.read_bytes()
    for size in (4, 10, 100, len(data) // 2, len(data) - 90, len(data) - 30, len(data) - 1):
        path.write_bytes(data[:size])
        with pytest.raises(CheckpointError, match=r"cannot be loaded: .*(truncated|cut)"):
            ckpt.load(path)


@pytest.mark.parametrize(
    ("write", "message"),
    [
        (lambda p: p.write_bytes(b""), "is empty"),
        (lambda p: p.write_text("hello"), r"not a corral checkpoint \(not a zip archive\)"),
        (lambda p: rewrite(p, {"a.txt": b"hi"}, seal=False), "zip archive without meta.json"),
        (lambda p: rewrite(p, {"meta.json": b"{}"}), "its meta.json is not that of a corral"),
        (
            lambda p: rewrite(p, {"meta.json": b'{"format":"corral-checkpoint","version":99}'}),
            "format version 99, written by a newer corral",
        ),
        (
            lambda p: rewrite(
                p, {"meta.json": b'{"format":"corral-checkpoint","version":99}'}, seal=False
            ),
            "format version 99",
        ),
        (lambda p: p.mkdir(), "cannot be read"),
    ],
)
def test_a_file_that_is_not_a_checkpoint_is_one_clear_error(
    tmp_path: Path, write: Callable[[Path], None], message: str
) -> None:
    path = tmp_path / BEST
    write(path)
    with pytest.raises(CheckpointError, match=f"{re.escape(str(path))}.*{message}"):
        ckpt.load(path)


# -- atomic and wall-clock checkpoints -------------------------------------------------------


def test_a_failed_write_leaves_the_previous_checkpoint_and_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / LATEST
    ckpt.save(path, {"n": 1, "a": np.arange(3)})
    write_array = np.lib.format.write_array

    def write_then_fail(file: Any, array: np.ndarray, **kwargs: Any) -> None:
        write_array(file, array, **kwargs)
        raise OSError("disk full")

    monkeypatch.setattr(np.lib.format, "write_array", write_then_fail)
    with pytest.raises(OSError, match="disk full"):
        ckpt.save(path, {"n": 2, "a": np.arange(1000)})
    monkeypatch.undo()
    assert ckpt.load(path)["n"] == 1
    assert os.listdir(tmp_path) == [LATEST]


def run_config(tmp_path: Path, **settings: Any) -> Any:
    base = {
        "num_envs": 2,
        "total_steps": 200,
        "eval_every": 0,
        "eval_episodes": 2,
        "checkpoint_every": 0,
        "log_every": 40,
        "device": "cpu",
        "tensorboard": False,
        "run_dir": str(tmp_path / "run"),
    }
    return load_config(TabularQ, "mdp/climbing", {**base, **settings})


def record_checkpoints(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The env steps of each ``checkpoint.pt`` that runs write from now on, as loaded back."""
    saved = []
    save = Runner.save_checkpoint

    def record(self: Runner, path: Path, **kwargs: Any) -> None:
        save(self, path, **kwargs)
        if Path(path).name == LATEST:
            saved.append(ckpt.load(path)["env_steps"])

    monkeypatch.setattr(Runner, "save_checkpoint", record)
    return saved


@pytest.mark.parametrize(("seconds", "steps"), [(1e-9, list(range(2, 201, 2))), (0, [200])])
def test_checkpoints_are_written_every_checkpoint_every_s_seconds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seconds: float, steps: list[int]
) -> None:
    saved = record_checkpoints(monkeypatch)
    with Runner(run_config(tmp_path, checkpoint_every_s=seconds), progress=False) as runner:
        runner.train()
    assert saved == steps  # 1e-9: after every vector step (of 2 envs)


def test_a_wall_clock_checkpoint_does_not_wait_for_a_metrics_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    saved = record_checkpoints(monkeypatch)
    settings = {"total_steps": 40, "log_every": 40, "checkpoint_every_s": 0.05}
    with Runner(run_config(tmp_path, **settings), progress=False) as runner:
        step = runner.venv.step

        def slow_step(actions: Any) -> Any:
            time.sleep(0.02)
            return step(actions)

        runner.venv.step = slow_step  # 20 vector steps of 20 ms or more, one metrics row
        runner.train()
    assert len(saved) >= 3 and saved[-1] == 40, saved
    assert all(0 < s < 40 and s % 2 == 0 for s in saved[:-1]), saved
    assert ckpt.load(tmp_path / "run" / LATEST)["elapsed"] >= 20 * 0.02


def test_a_run_killed_after_a_wall_clock_checkpoint_resumes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    settings = ["num_envs=2", "eval_every=0", "eval_episodes=2", "checkpoint_every=0"]
    settings += ["log_every=100", "checkpoint_every_s=0.5", "device=cpu", "tensorboard=false"]
    settings += ["learning_starts=50", "batch_size=8"]
    command = [sys.executable, "-m", "corral", "train", "dqn", "--env", "mdp/climbing"]
    command += ["--total-steps", "10000000", "--run-dir", str(run_dir), "--no-progress"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    with open(tmp_path / "stderr", "w") as stderr:  # a pipe nobody reads could fill up
        process = subprocess.Popen([*command, "--set", *settings], env=env, stderr=stderr)
        try:
            deadline = time.monotonic() + 60
            while not (run_dir / LATEST).exists() and process.poll() is None:
                assert time.monotonic() < deadline, "no checkpoint within 60 s"
                time.sleep(0.05)
        finally:
            process.send_signal(signal.SIGKILL)
            process.wait()
    assert process.returncode == -signal.SIGKILL, (tmp_path / "stderr").read_text()
    done = ckpt.load(run_dir / LATEST)["env_steps"]
    assert 0 < done < 10_000_000
    resume = [sys.executable, "-m", "corral", "train", "--resume", str(run_dir), "--no-progress"]
    resume += ["--total-steps", str(done + 200)]
    result = subprocess.run(resume, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert f"resumed at {done} env steps" in (run_dir / "train.log").read_text()
    assert read_metrics(run_dir)[-1]["env_steps"] == done + 200


def test_checkpoint_every_s_may_not_be_negative(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="checkpoint_every_s must be at least 0, got -1"):
        run_config(tmp_path, checkpoint_every_s=-1)


# -- another run's checkpoint, and reference opponents -----------------------------------------


@pytest.fixture(scope="module")
def rps_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Finished DQN and MAPPO runs on corral/rps (their evaluations play a reference opponent)."""
    runs = {}
    for algo in ("dqn", "mappo"):
        run_dir = tmp_path_factory.mktemp("runs") / algo
        settings = {"num_envs": 2, "total_steps": 40, "eval_every": 20, "eval_episodes": 2}
        settings |= {"log_every": 20, "device": "cpu", "tensorboard": False}
        if algo == "dqn":
            settings |= {"learning_starts": 20, "batch_size": 8}
        config = load_config(algo, "corral/rps", {**settings, "run_dir": str(run_dir)})
        with Runner(config, progress=False) as runner:
            runner.train()
        runs[algo] = run_dir
    return runs


def cli_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one line that ``corral ARGV`` prints, exiting 2."""
    code = cli.main(argv)
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("foreign", ["another algorithm", "another env", "an entry missing"])
@pytest.mark.parametrize("command", ["eval", "resume"])
def test_the_cli_refuses_another_run_s_checkpoint_in_one_line(
    rps_runs: dict[str, Path],
    dqn_run: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    command: str,
    foreign: str,
) -> None:
    run_dir = shutil.copytree(rps_runs["dqn"], tmp_path / "run")
    target = run_dir / (BEST if command == "eval" else LATEST)
    ours = "its run (dqn on corral/rps, as its config.yaml says)"
    if foreign == "another algorithm":
        shutil.copy(rps_runs["mappo"] / target.name, target)
        said = f"{target} is not a checkpoint of {ours}: it was written by a run of 'mappo'"
    elif foreign == "another env":
        shutil.copy(dqn_run / target.name, target)
        said = f"{target} is not a checkpoint of {ours}: it was written by a run on 'mdp/climbing'"
    else:
        saved = ckpt.load(target)
        del saved["learners"]
        ckpt.save(target, saved)
        said = f"{target} does not fit {ours}: another env, spaces or settings? it lacks the "
        said += "entry 'learners'"
    argv = ["eval", str(run_dir)]
    if command == "resume":
        argv = ["train", "--resume", str(run_dir), "--no-progress", "--total-steps", "60"]
    config = (run_dir / "config.yaml").read_text()
    assert cli_error(argv, capsys).startswith(f"corral: error: {said}")
    # a refused resume leaves the run as it was (its new schedule was written first)
    assert (run_dir / "config.yaml").read_text() == config


LACKING = [
    (algo, where, entry)
    for algo in ("dqn", "mappo")
    for where, entry in [
        ((), "env"),  # the env the run trained on
        ((), "best_steps"),  # a counter of the run
        (("learners", "main"), "decisions"),  # a counter of the learner
        (("learners", "main"), "version"),  # the policy's version
    ]
] + [("dqn", ("learners", "main"), "torch_rng")]  # DQN's generator of torch batches


@pytest.mark.parametrize(("algo", "where", "entry"), LACKING)
def test_a_checkpoint_lacking_an_entry_is_refused_naming_it(
    rps_runs: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    algo: str,
    where: tuple[str, ...],
    entry: str,
) -> None:
    # a checkpoint holds live state only: nothing missing is filled in with a default
    run_dir = shutil.copytree(rps_runs[algo], tmp_path / "run")
    saved = ckpt.load(run_dir / LATEST)
    holder = saved
    for key in where:
        holder = holder[key]
    del holder[entry]
    ckpt.save(run_dir / LATEST, saved)
    argv = ["train", "--resume", str(run_dir), "--no-progress", "--total-steps", "60"]
    line = cli_error(argv, capsys)
    assert line.startswith(f"corral: error: {run_dir / LATEST}") and f"'{entry}'" in line, line
    assert "lacks the entry" in line, line


def damage(path: Path) -> None:
    """Overwrite 16 bytes in the middle of ``path``, and give it a new modification time."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 16] = bytes(b ^ 0x5A for b in data[middle : middle + 16])
    stamp = path.stat().st_mtime_ns
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stamp + 10**9, stamp + 10**9))


@pytest.mark.parametrize("kind", ["damaged", "foreign"])
def test_corral_eval_refuses_a_damaged_or_foreign_opponent_in_one_line(
    rps_runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    opponent = shutil.copytree(rps_runs["dqn"], tmp_path / "opponent")
    if kind == "damaged":
        damage(opponent / BEST)
        said = f"{opponent / BEST} is damaged: its sha256 checksum does not match"
    else:
        shutil.copy(rps_runs["mappo"] / BEST, opponent / BEST)
        said = f"{opponent / BEST} is not a checkpoint of its run (dqn on corral/rps"
    line = cli_error(["eval", str(rps_runs["dqn"]), "--opponent", str(opponent)], capsys)
    assert line.startswith(f"corral: error: {said}")


def test_corral_train_refuses_an_eval_opponent_damaged_while_it_trains_in_one_line(
    rps_runs: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    opponent = shutil.copytree(rps_runs["dqn"], tmp_path / "opponent")
    train = Runner.train

    def damaged_first(self: Runner) -> Any:  # the opponent was read when the run started
        damage(opponent / BEST)
        return train(self)

    monkeypatch.setattr(Runner, "train", damaged_first)
    settings = ["num_envs=2", "eval_every=20", "eval_episodes=2", "log_every=20", "device=cpu"]
    settings += ["tensorboard=false", "learning_starts=20", "batch_size=8"]
    argv = ["train", "dqn", "--env", "corral/rps", "--total-steps", "40", "--no-progress"]
    argv += ["--run-dir", str(tmp_path / "run"), "--set", *settings]
    code = cli.main([*argv, f"eval_opponent={opponent}"])
    err = capsys.readouterr().err  # the run's log lines, then the error
    said = f"corral: error: {opponent / BEST} is damaged: its sha256 checksum"
    assert code == 2 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith(said), err
    assert sum(said in line for line in err.splitlines()) == 1, err


def test_the_torch_extras_need_a_torch_that_loads_checkpoints_safely() -> None:
    tomllib = pytest.importorskip("tomllib")
    from packaging.requirements import Requirement
    from packaging.version import Version

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = {f"extra {k}": v for k, v in project["optional-dependencies"].items()}
    pins = {}
    for where, requirements in {"dependencies": project["dependencies"], **extras}.items():
        for requirement in map(Requirement, requirements):
            if requirement.name == "torch":
                pins[where] = requirement.specifier
    assert pins, "no extra installs torch"
    safe = Version(".".join(map(str, ckpt.SAFE_TORCH)))
    below = Version(f"{safe.major}.{safe.minor - 1}.99")
    for where, specifier in pins.items():
        assert specifier.contains(safe) and not specifier.contains(below), (where, specifier)


def test_a_checkpoint_of_another_env_with_the_same_spaces_is_refused(
    dqn_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # mdp/penalty's networks have mdp/climbing's shapes: only the env named in it tells them apart
    settings = {"num_envs": 2, "total_steps": 40, "eval_every": 20, "eval_episodes": 2}
    settings |= {"learning_starts": 20, "batch_size": 8, "device": "cpu", "tensorboard": False}
    other = tmp_path / "penalty"
    config = load_config("dqn", "mdp/penalty", {**settings, "run_dir": str(other)})
    with Runner(config, progress=False) as runner:
        runner.train()
    run_dir = shutil.copytree(dqn_run, tmp_path / "run")
    shutil.copy(other / BEST, run_dir / BEST)
    said = f"{run_dir / BEST} is not a checkpoint of its run (dqn on mdp/climbing, as its "
    said += "config.yaml says): it was written by a run on 'mdp/penalty'"
    assert cli_error(["eval", str(run_dir)], capsys).startswith(f"corral: error: {said}")
