"""Checkpoint files read member by member, and rewritten as anyone could forge them."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

SEAL = b"corral-sha256:"


def rewrite(path: Path, members: dict[str, bytes], *, seal: bool = True) -> None:
    """Write ``members`` to the zip ``path``, with a valid checksum where ``seal``: what anyone
    can forge, so checksums are no defence against a crafted file, only against damage."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.comment = SEAL + b"0" * 64
        for name, data in members.items():
            archive.writestr(name, data)
    data = bytearray(path.read_bytes())
    if seal:
        data[-64:] = hashlib.sha256(data[: -len(SEAL) - 64]).hexdigest().encode()
    else:
        del data[-len(SEAL) - 64 :]
        data[-2:] = b"\0\0"  # no comment
    path.write_bytes(bytes(data))


def members(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as archive:
        return {name: archive.read(name) for name in archive.namelist()}
