"""Checkpoint files, and the global random generators a run must restore to resume.

A checkpoint file (``checkpoint.pt``, ``best.pt``) is a zip archive, stored
uncompressed, of:

``meta.json``
    the format name (``corral-checkpoint``), its version (:data:`FORMAT_VERSION`),
    the corral version that wrote it, and the checkpoint's plain data (counters,
    configs, metrics rows, generator states) as JSON, each tensor and array
    replaced by a reference;
``tensors.pt``
    the PyTorch tensors, a flat dict written by ``torch.save`` and read back with
    ``torch.load(weights_only=True)`` onto the CPU (only where there are tensors;
    torch 2.6 or later, as older versions of that loader can run code);
``arrays/N.npy``
    each NumPy array, read back with ``allow_pickle=False``;

and the archive's comment holds the sha256 of every byte before it. Loading
verifies that checksum first, then reads JSON, tensors and arrays only: it
never unpickles an object, so a crafted file cannot run code. A checkpoint
holds dicts (any hashable plain keys), lists, tuples, ``str``, ``int``,
``float``, ``bool``, ``None``, NumPy arrays and scalars and torch tensors;
:func:`save` refuses anything else, naming where it is.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import pickle
import random
import re
import struct
import sys
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import IO, Any

import numpy as np

import corral
from corral.errors import CheckpointError, MissingDependencyError
from corral.training.run_files import replacing

FORMAT = "corral-checkpoint"
FORMAT_VERSION = 1
"""The version of the checkpoint format this corral writes and reads."""

SAFE_TORCH = (2, 6)
"""The first torch whose ``torch.load(weights_only=True)`` runs no code from a crafted file."""

META = "meta.json"
TENSORS = "tensors.pt"
ARRAY = re.compile(r"arrays/\d+\.npy")
TAG = "__corral__"
"""The key that marks a JSON object standing for a value JSON lacks (a tuple, a tensor...)."""
SEAL = b"corral-sha256:"
SEAL_SIZE = len(SEAL) + 64
"""The archive comment: ``corral-sha256:`` and the hex sha256 of the bytes before it."""
PLAIN = (type(None), bool, int, float, str)
"""The types JSON holds as they are (exactly these: a subclass would come back as its base)."""
SCALAR_KINDS = "biuf"
"""NumPy scalar kinds kept in ``meta.json`` (up to 8 bytes, where ``item()`` is exact); other
scalars are kept as 0-d arrays."""
OLD = (
    "it was written by an older corral, which pickled its checkpoints; this corral does not "
    "load pickled checkpoints (loading one can run any code in it): train the run again, "
    "or use the corral version that wrote it"
)
BROKEN = (
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    OSError,
    EOFError,
    ValueError,
    KeyError,
    IndexError,
    TypeError,
    NotImplementedError,
    RuntimeError,
    OverflowError,
    RecursionError,
    struct.error,
)
"""What reading a zip archive, JSON or an npy member of a damaged or crafted file raises."""


def save(path: str | Path, checkpoint: dict[str, Any]) -> None:
    """Write ``checkpoint`` to ``path`` atomically: a write that fails or is killed leaves the
    previous file as it was. Raises :class:`CheckpointError` for a value a checkpoint cannot
    hold, and :class:`~corral.errors.ConfigError` where ``path`` or its ``.partial`` is not a
    regular file (a symbolic link...; see :mod:`corral.training.run_files`), before anything
    is written."""
    path = Path(path)
    encoder = _Encoder()
    meta = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "corral": corral.__version__,
        "data": encoder.encode(checkpoint, "checkpoint"),
    }
    with replacing(path) as file:
        with zipfile.ZipFile(file, "w", zipfile.ZIP_STORED) as archive:
            archive.comment = SEAL + b"0" * 64
            archive.writestr(META, json.dumps(meta, separators=(",", ":")))
            if encoder.tensors:
                tensors = io.BytesIO()
                sys.modules["torch"].save(encoder.tensors, tensors)
                archive.writestr(TENSORS, tensors.getbuffer())
            for name, array in encoder.arrays:
                with archive.open(name, "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, array, allow_pickle=False)
        _seal(file)


def load(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save`; tensors are loaded onto the CPU.

    Raises :class:`CheckpointError`, naming the file, for a file that is not such a
    checkpoint: empty, truncated, damaged, of another format version, an older
    corral's pickled checkpoint, or not a corral checkpoint at all.
    """
    path = Path(path)
    try:
        file = open(path, "rb")  # noqa: SIM115 (closed below)
    except OSError as err:
        raise CheckpointError(f"{path} cannot be read: {err.strerror}") from err
    with file:
        size = os.fstat(file.fileno()).st_size
        if size == 0:
            raise CheckpointError(f"{path} is empty: it is not a checkpoint")
        sealed = _sealed(file, size)
        if sealed is None:
            raise CheckpointError(f"{path} cannot be loaded: {_unsealed(file)}")
        if not sealed:
            raise CheckpointError(
                f"{path} is damaged: its sha256 checksum does not match its contents "
                "(the file was changed or cut short after it was written)"
            )
        file.seek(0)
        try:
            with zipfile.ZipFile(file) as archive:
                return _Decoder(path, archive).checkpoint()
        except CheckpointError:
            raise
        except BROKEN as err:
            raise CheckpointError(f"{path} is not a readable checkpoint: {err}") from err


# -- writing ------------------------------------------------------------------------------


class _Encoder:
    """Turns a checkpoint into JSON data, collecting its tensors and arrays on the side."""

    def __init__(self) -> None:
        self.tensors: dict[str, Any] = {}
        self.arrays: list[tuple[str, np.ndarray]] = []

    def encode(self, value: Any, where: str, *, key: bool = False) -> Any:
        """The JSON form of ``value`` (found at ``where``); ``key``: it is a dict key."""
        kind = type(value)
        if kind in PLAIN:
            return value
        if kind is tuple:
            items = [
                self.encode(v, where if key else f"{where}[{i}]", key=key)
                for i, v in enumerate(value)
            ]
            return {TAG: "tuple", "items": items}
        if isinstance(value, np.generic) and _in_json(value.dtype):
            return {TAG: "scalar", "dtype": value.dtype.str, "value": value.item()}
        if not key:
            if kind is list:
                return [self.encode(v, f"{where}[{i}]") for i, v in enumerate(value)]
            if kind is dict or kind is OrderedDict:
                return self._dict(value, where)
            if kind is np.ndarray or isinstance(value, np.generic):
                return self._array(value, where)
            torch = sys.modules.get("torch")
            if torch is not None and isinstance(value, torch.Tensor):
                name = str(len(self.tensors))
                self.tensors[name] = value.detach().to("cpu", copy=True)
                return {TAG: "tensor", "name": name}
        what = f"{kind.__module__}.{kind.__qualname__}"
        place = f"a key of {where}" if key else where
        raise CheckpointError(
            f"cannot save {place}: a checkpoint holds no {what} (only dicts, lists, tuples, "
            "str, int, float, bool, None, NumPy arrays and scalars and torch tensors"
            f"{'; a dict key may not hold a container, an array or a tensor' if key else ''})"
        )

    def _dict(self, value: dict, where: str) -> dict:
        plain = type(value) is dict and TAG not in value
        if plain and all(type(k) is str for k in value):
            return {k: self.encode(v, f"{where}[{k!r}]") for k, v in value.items()}
        node: dict[str, Any] = {
            TAG: "dict",
            "items": [
                [self.encode(k, where, key=True), self.encode(v, f"{where}[{k!r}]")]
                for k, v in value.items()
            ],
        }
        if type(value) is OrderedDict:
            node["ordered"] = True
            metadata = getattr(value, "_metadata", None)  # a torch module's state_dict versions
            if metadata is not None:
                node["metadata"] = self.encode(metadata, f"{where}._metadata")
        return node

    def _array(self, value: np.ndarray | np.generic, where: str) -> dict:
        scalar = isinstance(value, np.generic)
        value = np.asarray(value)
        if value.dtype.hasobject:
            raise CheckpointError(
                f"cannot save {where}: an array of Python objects (dtype {value.dtype}); "
                "a checkpoint holds arrays of numbers, booleans and strings only"
            )
        name = f"arrays/{len(self.arrays)}.npy"
        self.arrays.append((name, value))
        return {TAG: "array", "member": name, **({"scalar": True} if scalar else {})}


def _in_json(dtype: np.dtype) -> bool:
    return dtype.kind in SCALAR_KINDS and dtype.itemsize <= 8


def _digest(file: IO[bytes], size: int) -> str:
    """The hex sha256 of the first ``size`` bytes of ``file``."""
    sha = hashlib.sha256()
    file.seek(0)
    left = size
    while left > 0:
        chunk = file.read(min(left, 1 << 20))
        if not chunk:
            break
        sha.update(chunk)
        left -= len(chunk)
    return sha.hexdigest()


def _seal(file: IO[bytes]) -> None:
    """Write the sha256 of the archive in ``file`` into its comment, its last bytes."""
    size = file.seek(0, os.SEEK_END)
    digest = _digest(file, size - SEAL_SIZE)
    file.seek(size - SEAL_SIZE)
    file.write(SEAL + digest.encode("ascii"))


# -- reading ------------------------------------------------------------------------------


def _sealed(file: IO[bytes], size: int) -> bool | None:
    """Whether the checksum at the end of ``file`` matches; ``None`` where there is none."""
    if size < SEAL_SIZE:
        return None
    file.seek(size - SEAL_SIZE)
    tail = file.read(SEAL_SIZE)
    digest = tail[len(SEAL) :]
    if not tail.startswith(SEAL) or not re.fullmatch(rb"[0-9a-f]{64}", digest):
        return None
    return _digest(file, size - SEAL_SIZE) == digest.decode("ascii")


def _unsealed(file: IO[bytes]) -> str:
    """What a file without a checksum is: an old checkpoint, another format, not one at all."""
    file.seek(0)
    head = file.read(4)
    if head[:1] == b"\x80":  # a pickle (and the legacy torch.save format)
        return OLD
    file.seek(0)
    try:
        with zipfile.ZipFile(file) as archive:
            names = archive.namelist()
            if META not in names:
                if any(n == "data.pkl" or n.endswith("/data.pkl") for n in names):
                    return OLD  # torch.save's zip archive
                return f"it is a zip archive without {META}, not a corral checkpoint"
            if archive.getinfo(META).compress_type != zipfile.ZIP_STORED:
                return f"its {META} is compressed: it is not a corral checkpoint"
            version = _format_version(json.loads(archive.read(META)))
    except BROKEN:
        if head == b"PK\x03\x04":
            return "it is truncated or damaged (not a complete zip archive)"
        return "it is not a corral checkpoint (not a zip archive)"
    if version is None:
        return f"its {META} is not that of a corral checkpoint"
    if version != FORMAT_VERSION:
        return _other_version(version)
    return "it is damaged or cut short: its sha256 checksum is missing"


def _format_version(meta: Any) -> int | None:
    """The format version that ``meta.json`` declares; ``None`` if not a corral checkpoint's."""
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        return None
    version = meta.get("version")
    return version if type(version) is int else None


def _other_version(version: int) -> str:
    which = "a newer" if version > FORMAT_VERSION else "an older"
    return (
        f"it has checkpoint format version {version}, written by {which} corral; this corral "
        f"({corral.__version__}) reads version {FORMAT_VERSION} only"
    )


class _Decoder:
    """Rebuilds the checkpoint of a verified archive from its JSON, tensors and arrays."""

    def __init__(self, path: Path, archive: zipfile.ZipFile) -> None:
        self.path = path
        self.archive = archive
        self.names = {info.filename for info in archive.infolist()}
        self.tensors: dict[str, Any] = {}

    def checkpoint(self) -> dict[str, Any]:
        infos = self.archive.infolist()
        if any(info.compress_type != zipfile.ZIP_STORED for info in infos):
            raise CheckpointError(f"{self.path} holds compressed members: corral did not write it")
        meta = json.loads(self.archive.read(META))
        version = _format_version(meta)
        if version is None:
            raise CheckpointError(f"{self.path}: its {META} is not that of a corral checkpoint")
        if version != FORMAT_VERSION:
            raise CheckpointError(f"{self.path} cannot be loaded: {_other_version(version)}")
        odd = sorted(n for n in self.names if n not in (META, TENSORS) and not ARRAY.fullmatch(n))
        if odd or len(self.names) < len(infos):
            raise CheckpointError(
                f"{self.path} holds members that a corral checkpoint has not: {odd or 'twice'}"
            )
        if TENSORS in self.names:
            self.tensors = self._read_tensors()
        data = self.decode(meta["data"])
        if not isinstance(data, dict):
            raise CheckpointError(f"{self.path} holds no checkpoint dict")
        return data

    def decode(self, node: Any) -> Any:
        if isinstance(node, list):
            return [self.decode(v) for v in node]
        if not isinstance(node, dict):
            return node
        tag = node.get(TAG)
        if tag is None:
            return {k: self.decode(v) for k, v in node.items()}
        if tag == "tuple":
            return tuple(self.decode(v) for v in node["items"])
        if tag == "dict":
            items = ((self.decode(k), self.decode(v)) for k, v in node["items"])
            if not node.get("ordered"):
                return dict(items)
            ordered = OrderedDict(items)
            if "metadata" in node:
                ordered._metadata = self.decode(node["metadata"])  # type: ignore[attr-defined]
            return ordered
        if tag == "tensor":
            return self.tensors[node["name"]]
        if tag == "array":
            array = self._read_array(node["member"])
            return array[()] if node.get("scalar") else array
        if tag == "scalar":
            return self._scalar(node)
        raise CheckpointError(f"{self.path} holds a value of unknown kind {tag!r}")

    def _scalar(self, node: dict) -> np.generic:
        dtype = np.dtype(node["dtype"])
        if not _in_json(dtype):
            raise CheckpointError(f"{self.path} holds a scalar of dtype {dtype}")
        return dtype.type(node["value"])

    def _read_array(self, member: str) -> np.ndarray:
        if member not in self.names or not ARRAY.fullmatch(member):
            raise CheckpointError(f"{self.path} lacks the array {member}")
        self._check_array_size(member)
        with self.archive.open(member) as file:
            return np.lib.format.read_array(file, allow_pickle=False)

    def _check_array_size(self, member: str) -> None:
        """Refuse an array whose header declares more (or fewer) bytes than its member holds,
        before memory is allocated for it."""
        with self.archive.open(member) as file:
            version = np.lib.format.read_magic(file)
            read_header = {
                (1, 0): np.lib.format.read_array_header_1_0,
                (2, 0): np.lib.format.read_array_header_2_0,
            }.get(version)
            if read_header is None:
                raise CheckpointError(f"{self.path}: {member} has npy format version {version}")
            shape, _, dtype = read_header(file)
            header = file.tell()
        held = self.archive.getinfo(member).file_size - header
        declared = math.prod(shape) * dtype.itemsize
        if declared != held:
            raise CheckpointError(
                f"{self.path}: {member} declares an array of shape {shape} and dtype {dtype} "
                f"({declared} bytes), but holds {held} bytes: corral did not write it"
            )

    def _read_tensors(self) -> dict[str, Any]:
        try:
            import torch
        except ImportError as err:
            raise MissingDependencyError(
                f"{self.path} holds PyTorch tensors: pip install 'corral[torch]'"
            ) from err
        if not _loads_safely(torch.__version__):
            safe = ".".join(map(str, SAFE_TORCH))
            raise MissingDependencyError(
                f"{self.path} holds PyTorch tensors, and torch {torch.__version__} cannot load "
                f"them safely: before {safe}, torch.load(weights_only=True) can run code hidden "
                f"in a file (CVE-2025-32434): pip install 'torch>={safe}'"
            )
        buffer = io.BytesIO(self.archive.read(TENSORS))
        try:
            tensors = torch.load(buffer, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as err:  # what torch's restricted unpickler refuses
            raise CheckpointError(
                f"{self.path}: its {TENSORS} holds {_refused(err)} besides tensors, which "
                "corral does not load (loading it could run code): corral did not write it"
            ) from err
        except Exception as err:  # whatever else torch raises for a file it cannot read
            reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise CheckpointError(f"{self.path}: its {TENSORS} cannot be read: {reason}") from err
        if not isinstance(tensors, dict) or not all(
            isinstance(t, torch.Tensor) for t in tensors.values()
        ):
            raise CheckpointError(f"{self.path}: its {TENSORS} is not a dict of tensors")
        return tensors


def _loads_safely(version: str) -> bool:
    """Whether torch ``version`` loads ``weights_only=True`` without running code."""
    found = re.match(r"(\d+)\.(\d+)", version)
    return found is not None and tuple(map(int, found.groups())) >= SAFE_TORCH


def _refused(err: pickle.UnpicklingError) -> str:
    """What torch's restricted unpickler refused, in a few words (its message is a page)."""
    found = re.search(r"GLOBAL (\S+)", str(err))
    return f"the Python object {found.group(1)}" if found else "Python objects"


# -- the global random generators ----------------------------------------------------------


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and (when loaded) PyTorch's global generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """The state of the global generators, for :func:`set_rng_state`."""
    state: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state()}
    torch = sys.modules.get("torch")
    if torch is not None:
        state["torch"] = torch.get_rng_state()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["torch_cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned (CUDA generators only where there are as many)."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch = sys.modules.get("torch")
    if torch is not None and "torch" in state:
        torch.set_rng_state(state["torch"])
        cuda = state.get("torch_cuda")
        if (
            cuda is not None
            and torch.cuda.is_available()
            and torch.cuda.device_count() == len(cuda)
        ):
            torch.cuda.set_rng_state_all(cuda)
