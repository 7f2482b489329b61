"""The files a run writes in its directory, and the one rule they all follow.

A run directory may come from anyone (a colleague's archive, a shared disk), so
every file a run writes there is a regular file of that directory itself: a name
that is a symbolic link (to a file or directory elsewhere), a FIFO, a device, a
directory where a file belongs, or a file with other hard links is refused with a
:class:`~corral.errors.ConfigError` naming it, before the run writes anything, and
again where each file is opened (``O_NOFOLLOW``). A checkpoint is replaced through
a temporary ``.partial`` beside it, made afresh (``O_EXCL``) and renamed within the
directory.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from corral.errors import ConfigError

PARTIAL = ".partial"
"""The suffix of the temporary file a checkpoint is written to before it replaces the file."""
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
NONBLOCK = getattr(os, "O_NONBLOCK", 0)
"""Opening a FIFO that appeared after the check must not wait for a reader (POSIX only)."""
WHY = "corral writes only regular files of the run directory itself (it may come from anyone)"


def check_entries(
    run_dir: str | Path,
    *,
    files: Iterable[str] = (),
    replaced: Iterable[str] = (),
    dirs: Iterable[str] = (),
) -> None:
    """Refuse the run directory, or an entry of it that exists and is not what the run writes
    there: ``files`` are written in place (regular files of one link), ``replaced`` through
    :func:`replacing` (regular files, and their ``.partial``), ``dirs`` are directories."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        return
    if not run_dir.is_dir():
        raise ConfigError(f"run_dir {run_dir} is not a directory")
    for name in files:
        _check_file(run_dir, name)
    for name in replaced:
        _check_file(run_dir, name, links=True)
        _check_file(run_dir, name + PARTIAL)
    for name in dirs:
        _check_dir(run_dir, name)


def make_run_dir(run_dir: str | Path) -> None:
    """Make ``run_dir`` (and its parents) unless it exists; a path that cannot be a directory
    is one error naming it and why."""
    run_dir = Path(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except FileExistsError as err:  # a file (or a link to one) where the directory belongs
        raise ConfigError(
            f"run_dir {run_dir} is not a directory: {err.filename} is a file"
        ) from err
    except OSError as err:
        raise ConfigError(f"run_dir {run_dir} cannot be made: {_reason(err)}") from err


def make_subdir(run_dir: str | Path, name: str) -> Path:
    """The directory ``name`` of the run (``tb``), made unless it exists; refused where it is a
    symbolic link or not a directory."""
    path = _check_dir(Path(run_dir), name)
    try:
        os.mkdir(path)
    except FileExistsError:
        _check_dir(Path(run_dir), name)  # made meanwhile: still a directory of its own
    except OSError as err:
        raise ConfigError(f"cannot make {path}: {_reason(err)}") from err
    return path


def open_file(run_dir: str | Path, name: str, mode: str = "w") -> IO[str]:
    """The run's text file ``name`` opened for writing (``"w"``) or appending (``"a"``), with
    lines written as given (as ``newline=""``)."""
    flags = {"w": os.O_TRUNC, "a": os.O_APPEND}[mode]
    fd = _open(Path(run_dir), name, os.O_WRONLY | os.O_CREAT | flags)
    return os.fdopen(fd, mode, newline="", encoding="utf-8")


def create_file(run_dir: str | Path, name: str) -> IO[bytes]:
    """A new binary file ``name`` of the run (or of a directory of it, ``tb``), opened for
    writing; anything already there under that name is refused."""
    fd = _open(Path(run_dir), name, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    return os.fdopen(fd, "wb")


def write_text(run_dir: str | Path, name: str, text: str) -> None:
    """Write ``text`` to the run's file ``name``, replacing what it held."""
    with open_file(run_dir, name) as file:
        file.write(text)


@contextlib.contextmanager
def replacing(path: str | Path) -> Iterator[IO[bytes]]:
    """A new binary file ``path.partial`` that replaces ``path`` once written and synced to
    disk, so that ``path`` stays whole until then; removed if writing it fails. A leftover
    ``.partial`` (a run killed while writing) is removed first."""
    path = Path(path)
    run_dir, partial = path.parent, path.name + PARTIAL
    _check_file(run_dir, path.name, links=True)  # replaced by a rename: its other links stay
    _check_file(run_dir, partial)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(run_dir / partial)
    fd = _open(run_dir, partial, os.O_RDWR | os.O_CREAT | os.O_EXCL)
    try:
        with os.fdopen(fd, "w+b") as file:
            yield file
            file.flush()
            os.fsync(file.fileno())
        _check_file(run_dir, path.name, links=True)
        os.replace(run_dir / partial, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(run_dir / partial)
        raise
    _fsync_dir(run_dir)


def _open(run_dir: Path, name: str, flags: int) -> int:
    """``os.open`` of the run's file ``name``, refusing what :func:`check_entries` refuses."""
    path = _check_file(run_dir, name)
    try:
        fd = os.open(path, flags | NOFOLLOW | NONBLOCK, 0o644)
    except OSError as err:
        if err.errno == errno.ELOOP:  # it became a link since it was checked
            raise ConfigError(f"{path} is a symbolic link: {WHY}") from err
        raise ConfigError(f"cannot write {path}: {_reason(err)}") from err
    try:
        _refuse(path, os.fstat(fd))
    except BaseException:
        os.close(fd)
        raise
    if NONBLOCK:
        os.set_blocking(fd, True)
    return fd


def _check_file(run_dir: Path, name: str, *, links: bool = False) -> Path:
    """The path of the run's file ``name``, refused unless absent or a regular file (of one
    link, unless ``links``)."""
    path, found = _status(run_dir, name, "cannot write")
    if found is not None:
        _refuse(path, found, links=links)
    return path


def _check_dir(run_dir: Path, name: str) -> Path:
    path, found = _status(run_dir, name, "cannot write in")
    if found is None:
        return path
    if stat.S_ISLNK(found.st_mode):
        raise ConfigError(
            f"{path} is a symbolic link: corral writes only in directories of "
            "the run directory itself (it may come from anyone)"
        )
    if not stat.S_ISDIR(found.st_mode):
        raise ConfigError(f"{path} is not a directory: the run writes a directory there")
    return path


def _status(run_dir: Path, name: str, failing: str) -> tuple[Path, os.stat_result | None]:
    """The path of the run's entry ``name`` and its own status (``None``: absent); an
    ``lstat`` that fails otherwise is a :class:`ConfigError` reading ``failing PATH``."""
    path = _entry(run_dir, name)
    try:
        return path, os.lstat(path)
    except FileNotFoundError:
        return path, None
    except OSError as err:
        raise ConfigError(f"{failing} {path}: {_reason(err)}") from err


def _entry(run_dir: Path, name: str) -> Path:
    if not name or name in (".", "..") or os.sep in name or (os.altsep or os.sep) in name:
        raise ConfigError(f"{name!r} is not the name of a file of the run directory {run_dir}")
    return run_dir / name


def _refuse(path: Path, found: os.stat_result, *, links: bool = False) -> None:
    """Raise unless ``found`` (the status of ``path``) is a regular file (of one link, unless
    ``links``)."""
    mode = found.st_mode
    if stat.S_ISLNK(mode):
        raise ConfigError(f"{path} is a symbolic link: {WHY}")
    if not stat.S_ISREG(mode):
        raise ConfigError(f"{path} is not a regular file: {WHY}")
    if found.st_nlink > 1 and not links:
        raise ConfigError(f"{path} has other hard links ({found.st_nlink - 1}): {WHY}")


def _reason(err: OSError) -> str:
    return err.strerror or type(err).__name__


def _fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable (POSIX; elsewhere a no-op)."""
    if os.name != "posix":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
