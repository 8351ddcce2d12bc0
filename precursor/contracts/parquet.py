"""Parquet held in memory (an object's bytes) read into a table, safely for a process about to exit."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq


def read_parquet_bytes(data: bytes, schema: pa.Schema | None = None) -> pa.Table:
    """``data`` (a whole Parquet file) as a table, read from a copy in Arrow's own memory.

    Arrow reads Parquet with futures on its IO threads, and one of them may drop the last reference to the input
    buffer after the table is returned. When that buffer is a Python object (``bytes`` handed to ``pa.BufferReader``,
    or the reads of a Python file object), that thread must take the GIL to release it. If the interpreter is
    finalizing by then, CPython ends the thread inside a C++ destructor and the process aborts with "terminate called
    without an active exception" after its work is done: a clean ``precursor pipeline label`` exited with SIGABRT.
    Measured with pyarrow 25.0.1: 1 exit in 5 of a process that read day files from ``bytes``, none in 80 from a copy
    or a path. The copy costs one memcpy of a file that is read whole anyway.
    """
    sink = pa.BufferOutputStream()
    sink.write(data)
    return pq.read_table(pa.BufferReader(sink.getvalue()), schema=schema)
