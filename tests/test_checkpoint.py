"""Checkpoint files: loading runs no code, damage is detected, writes are atomic and timely."""

from __future__ import annotations

import io
import json
import os
import pickle
import random
import signal
import subprocess
import sys
import time
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from corral.errors import CheckpointError
from corral.training import checkpoint as ckpt
from corral.training.runner import LATEST, Runner, load_run

torch = pytest.importorskip("torch")


def sample() -> dict[str, Any]:
    """Every kind of value a checkpoint holds, as the algorithms and the runner produce them."""
    random.seed(3)
    np.random.seed(4)
    net = torch.nn.Linear(3, 2)
    return {
        "algo_state": {
            "net": net.state_dict(),
            "opt": torch.optim.Adam(net.parameters()).state_dict(),
        },
        "env_steps": 160,
        "best_eval": None,
        "ratio": float("nan"),
        "rows": [{"env_steps": 0, "eval_return": -1.5}],
        "python_rng": random.getstate(),
        "numpy_rng": np.random.get_state(),
        "collector_rng": np.random.default_rng(5).bit_generator.state,
        "torch_rng": torch.get_rng_state(),
        "keys": {0: "zero", (1, "a"): [True, np.int64(7)], np.float32(0.5): b"raw".hex()},
        "arrays": [np.arange(6, dtype=np.float32).reshape(2, 3), np.zeros(0, np.int8)],
        "scalar": np.float64(2.5),
        "bool_mask": np.array([True, False]),
    }


def same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, float) and a != a:
        return b != b
    return a == b


def test_a_checkpoint_round_trips_every_kind_of_value(tmp_path: Path) -> None:
    data = sample()
    ckpt.save(tmp_path / "c.pt", data)
    loaded = ckpt.load(tmp_path / "c.pt")
    assert same(loaded, data)
    assert isinstance(loaded["algo_state"]["net"], OrderedDict)
    random.setstate(loaded["python_rng"])  # generator states restore as they were
    np.random.set_state(loaded["numpy_rng"])
    assert random.random() == (random.seed(3), random.random())[1]


def test_a_value_a_checkpoint_cannot_hold_is_refused_at_save_naming_where(tmp_path: Path):
    ckpt.save(tmp_path / "c.pt", {"env_steps": 1})
    with pytest.raises(CheckpointError, match=r"checkpoint\['algo'\]\['policy'\].*Exploit"):
        ckpt.save(tmp_path / "c.pt", {"algo": {"policy": Exploit()}})
    assert ckpt.load(tmp_path / "c.pt") == {"env_steps": 1}  # the previous file is untouched
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]


class Exploit:
    """Writes a marker file when unpickled: what a crafted checkpoint would carry."""

    def __init__(self, marker: str = "") -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (Path.touch, (Path(self.marker),))


def write_old_pickle(path: Path, marker: Path) -> None:
    """A checkpoint as corral wrote it before its format version 1, with a payload."""
    with open(path, "wb") as file:
        pickle.dump({"algo_state": {}, "env_steps": 0, "x": Exploit(str(marker))}, file)


def write_old_torch(path: Path, marker: Path) -> None:
    torch.save({"algo_state": {}, "x": Exploit(str(marker))}, path)


@pytest.mark.parametrize("write", [write_old_pickle, write_old_torch])
def test_an_old_pickled_checkpoint_is_refused_and_runs_no_code(tmp_path: Path, write) -> None:
    marker = tmp_path / "owned"
    write(tmp_path / "c.pt", marker)
    with pytest.raises(CheckpointError, match=r"c\.pt.*older corral.*pickled"):
        ckpt.load(tmp_path / "c.pt")
    assert not marker.exists()


def damaged_copies(path: Path) -> dict[str, bytes]:
    data = path.read_bytes()
    with zipfile.ZipFile(path) as archive:
        offsets = {i.filename: i.header_offset for i in archive.infolist()}
    where = {
        "meta.json": offsets["meta.json"] + 60,
        "tensors.pt": offsets["tensors.pt"] + 200,
        "an array": offsets["arrays/0.npy"] + 90,
        "the central directory": len(data) - 200,
        "the start": 0,
    }
    copies = {}
    for name, at in where.items():
        copy = bytearray(data)
        copy[at : at + 16] = bytes(b ^ 0x5A for b in copy[at : at + 16])
        copies[name] = bytes(copy)
    copies["cut short"] = data[: len(data) // 2]
    copies["empty"] = b""
    copies["not a zip"] = b"hello, this is not a checkpoint at all" * 4
    return copies


def test_every_damage_is_a_checkpoint_error_naming_the_file(tmp_path: Path) -> None:
    ckpt.save(tmp_path / "good.pt", sample())
    for name, content in damaged_copies(tmp_path / "good.pt").items():
        path = tmp_path / "bad.pt"
        path.write_bytes(content)
        with pytest.raises(CheckpointError, match=r"bad\.pt") as err:
            ckpt.load(path)
        assert err.type is CheckpointError, name


def reseal(path: Path, edit) -> None:
    """Rewrite the archive at ``path`` with ``edit(members)`` applied, sealed as corral seals."""
    with zipfile.ZipFile(path) as archive:
        members = {n: archive.read(n) for n in archive.namelist()}
    edit(members)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        archive.comment = ckpt.SEAL + b"0" * 64
        for name, content in members.items():
            archive.writestr(name, content)
    ckpt._seal(buffer)
    path.write_bytes(buffer.getvalue())


def test_another_format_version_or_a_foreign_zip_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.pt"
    ckpt.save(path, {"env_steps": 3})

    def newer(members: dict[str, bytes]) -> None:
        meta = json.loads(members["meta.json"])
        members["meta.json"] = json.dumps({**meta, "version": 99}).encode()

    reseal(path, newer)
    with pytest.raises(CheckpointError, match=r"format version 99.*newer corral"):
        ckpt.load(path)
    with zipfile.ZipFile(tmp_path / "foreign.pt", "w") as archive:
        archive.writestr("weights.bin", b"\0" * 10)
    with pytest.raises(CheckpointError, match="not a corral checkpoint"):
        ckpt.load(tmp_path / "foreign.pt")


def test_an_extra_member_is_refused_even_when_sealed(tmp_path: Path) -> None:
    path = tmp_path / "c.pt"
    ckpt.save(path, sample())
    payload = pickle.dumps(Exploit(str(tmp_path / "owned")))
    reseal(path, lambda members: members.update({"data.pkl": payload}))
    with pytest.raises(CheckpointError, match="members a corral checkpoint has not"):
        ckpt.load(path)
    assert not (tmp_path / "owned").exists()


def test_a_pickle_inside_tensors_pt_is_not_run(tmp_path: Path) -> None:
    path = tmp_path / "c.pt"
    ckpt.save(path, sample())
    crafted = io.BytesIO()
    torch.save({"0": Exploit(str(tmp_path / "owned"))}, crafted)
    reseal(path, lambda members: members.update({"tensors.pt": crafted.getvalue()}))
    with pytest.raises(CheckpointError, match=r"tensors\.pt cannot be read"):
        ckpt.load(path)
    assert not (tmp_path / "owned").exists()


def test_a_failed_write_keeps_the_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "c.pt"
    ckpt.save(path, {"env_steps": 1})

    def broken_seal(file: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(ckpt, "_seal", broken_seal)
    with pytest.raises(OSError, match="disk full"):
        ckpt.save(path, {"env_steps": 2})
    assert ckpt.load(path) == {"env_steps": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]


# -- runs -----------------------------------------------------------------------------------


def cli(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [sys.executable, "-m", "corral", *argv],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=120,
    )


FAST = ["num_envs=2", "eval_episodes=2", "log_every=20", "device=cpu", "tensorboard=false"]


def small_run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    done = cli(
        "train", "dqn", "--env", "mdp/climbing", "--total-steps", "40", "--run-dir", str(run),
        "--no-progress", "--set", *FAST, "eval_every=20", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return run


def test_crafted_checkpoints_run_no_code_under_eval_or_resume(tmp_path: Path) -> None:
    run = small_run(tmp_path)
    marker = tmp_path / "owned"
    for name in ("best.pt", LATEST):
        write_old_pickle(run / name, marker)
    for argv in (["eval", str(run)], ["train", "--resume", str(run), "--no-progress"]):
        done = cli(*argv, cwd=tmp_path)
        assert done.returncode != 0
        assert "older corral" in done.stderr and "Traceback" not in done.stderr, done.stderr
        assert not marker.exists()


def test_wall_clock_checkpoints_are_written_between_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from corral.training.config import load_config

    saved: list[int] = []
    save = Runner.save_checkpoint

    def record(self: Runner, path: Any, **kwargs: Any) -> None:
        save(self, path, **kwargs)
        if Path(path).name == LATEST:
            saved.append(self.env_steps)

    monkeypatch.setattr(Runner, "save_checkpoint", record)
    settings = {
        "num_envs": 2, "total_steps": 100, "eval_every": 0, "checkpoint_every": 0,
        "log_every": 20, "device": "cpu", "tensorboard": False,
    }  # fmt: skip
    for every, expected in ((1e-9, [20, 40, 60, 80, 100]), (0, [100])):
        saved.clear()
        config = load_config(
            "dqn", "mdp/climbing", {**settings, "checkpoint_every_s": every,
                                    "run_dir": str(tmp_path / f"r{every}")}
        )  # fmt: skip
        with Runner(config, progress=False) as runner:
            runner.benchmark()
        assert saved == expected


def test_a_killed_run_resumes_from_its_wall_clock_checkpoint(tmp_path: Path) -> None:
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    argv = [
        sys.executable, "-m", "corral", "train", "dqn", "--env", "mdp/climbing",
        "--total-steps", "100000000", "--run-dir", str(run), "--no-progress",
        "--set", *FAST, "eval_every=0", "checkpoint_every=0", "checkpoint_every_s=0.2",
    ]  # fmt: skip
    process = subprocess.Popen(argv, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (run / LATEST).exists() and time.monotonic() < deadline:
            assert process.poll() is None, process.stderr.read()
            time.sleep(0.1)
        time.sleep(0.5)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
        process.stderr.close()
    steps = ckpt.load(run / LATEST)["env_steps"]
    assert steps > 0
    done = cli(
        "train", "--resume", str(run), "--no-progress", "--total-steps", str(steps + 40),
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"resumed at {steps} env steps" in done.stderr
    assert load_run(run, "latest")[2]["env_steps"] == steps + 40
