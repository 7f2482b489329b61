"""A run's TensorBoard event file, written under the rule of every file of the run.

TensorBoard's own writer opens its event file by name, following a symbolic link that
someone placed there. :class:`RunEventFile` is the ``Output`` a ``tensorboard.summary.Writer``
writes through instead: a new file of the run's ``tb`` directory, created exclusively and
without following a link (:func:`corral.training.run_files.create_file`), holding the
records TensorBoard reads (its ``RecordWriter`` framing of ``Event`` protos). Imported only
where ``tensorboard`` is installed.
"""

from __future__ import annotations

import itertools
import os
import socket
import time
from pathlib import Path
from typing import Any

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary import Output
from tensorboard.summary.writer.record_writer import RecordWriter
from tensorboard.util import tensor_util

from corral.training import run_files

_SERIAL = itertools.count()


def event_file_name() -> str:
    """TensorBoard's name for a new event file: time, host, process and a serial number
    within the process (TensorBoard reads every file whose name holds ``tfevents``)."""
    stamp = int(time.time())
    return f"events.out.tfevents.{stamp:010d}.{socket.gethostname()}.{os.getpid()}.{next(_SERIAL)}"


class RunEventFile(Output):
    """TensorBoard events in a new file of ``directory`` (a run's ``tb``)."""

    def __init__(self, directory: str | Path) -> None:
        self.file = run_files.create_file(directory, event_file_name())
        self.records = RecordWriter(self.file)
        self._write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))
        self.flush()

    def emit_scalar(
        self,
        *,
        plugin_name: str,
        tag: str,
        data: Any,
        step: Any,
        wall_time: float,
        tag_metadata: bytes | None = None,
        description: str | None = None,
    ) -> None:
        metadata = summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(
                plugin_name=plugin_name, content=tag_metadata
            ),
            summary_description=description,
            data_class=summary_pb2.DataClass.DATA_CLASS_SCALAR,
        )
        event = event_pb2.Event(wall_time=wall_time, step=step)
        event.summary.value.add(
            tag=tag, tensor=tensor_util.make_tensor_proto(data), metadata=metadata
        )
        self._write(event)

    def _write(self, event: Any) -> None:
        self.records.write(event.SerializeToString())

    def flush(self) -> None:
        self.file.flush()

    def close(self) -> None:
        self.file.close()
