"""A batch job's results, written as they come, read back to resume.

A result is a :class:`Result`: a line's ``custom_id`` and either its output
tensors or its error. Every custom id gets exactly one: a writer knows which
ids it holds (:meth:`done`) and a job runs only the others.

- :class:`JsonlResults`: one JSON object per line, appended as results
  arrive, flushed and fsync'ed at :meth:`~JsonlResults.sync` (a job syncs
  every second, and when it stops). Tensors are KServe
  v2 JSON tensors (``name``, ``datatype``, ``shape``, ``data``); BYTES that are
  not UTF-8 are base64 (``parameters.encoding: "base64"``), so nothing is
  lost. A last line cut short by a crash is dropped when the file is reopened.
- :class:`ParquetResults` (needs pyarrow): a folder of Parquet files, one per
  :meth:`~ParquetResults.sync`, each written whole and renamed into place.
  Columns: ``custom_id``, ``model_version``, ``error`` (null on success), and
  per output ``<name>`` (its values, flattened) and ``<name>__shape``.
- :func:`npz_bytes`: results as one NPZ, ``<custom_id>/<output>`` arrays, with
  the errors as JSON in ``__errors__``.
"""

from __future__ import annotations

import base64
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Protocol

import numpy as np

from inferd.dtypes import BY_NAME, from_numpy

ERRORS_KEY = "__errors__"


@dataclass(slots=True)
class Result:
    custom_id: str
    outputs: dict[str, np.ndarray] | None = None
    error: str | None = None
    error_type: str | None = None
    model_version: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None


class ResultWriter(Protocol):
    def done(self) -> set[str]: ...
    def write(self, result: Result) -> None: ...
    def sync(self) -> None: ...
    def close(self) -> None: ...


# -- tensors as JSON ---------------------------------------------------------------------


def tensor_json(name: str, array: np.ndarray) -> dict[str, Any]:
    wire = from_numpy(array.dtype).name
    doc: dict[str, Any] = {"name": name, "datatype": wire, "shape": list(array.shape)}
    flat = array.reshape(-1)
    if wire == "BYTES":
        items = [x if isinstance(x, bytes) else str(x).encode() for x in flat]
        try:
            doc["data"] = [x.decode("utf-8") for x in items]
        except UnicodeDecodeError:
            doc["parameters"] = {"encoding": "base64"}
            doc["data"] = [base64.b64encode(x).decode("ascii") for x in items]
        return doc
    doc["data"] = (flat.astype(np.float32) if wire == "BF16" else flat).tolist()
    return doc


def tensor_from_json(doc: dict[str, Any]) -> np.ndarray:
    dtype = BY_NAME[doc["datatype"]]
    shape = tuple(doc["shape"])
    if dtype.name == "BYTES":
        b64 = (doc.get("parameters") or {}).get("encoding") == "base64"
        items = [base64.b64decode(x) if b64 else x.encode("utf-8") for x in doc["data"]]
        out = np.empty(len(items), dtype=np.object_)
        out[:] = items
        return out.reshape(shape)
    return np.asarray(doc["data"], dtype=dtype.numpy).reshape(shape)


def result_json(result: Result) -> dict[str, Any]:
    doc: dict[str, Any] = {"custom_id": result.custom_id}
    if result.error is not None:
        doc["error"] = {"type": result.error_type or "InferdError", "message": result.error}
        return doc
    doc["model_version"] = result.model_version
    doc["outputs"] = [tensor_json(n, a) for n, a in (result.outputs or {}).items()]
    return doc


def result_from_json(doc: dict[str, Any]) -> Result:
    error = doc.get("error")
    if error is not None:
        return Result(doc["custom_id"], error=error.get("message", ""), error_type=error.get("type"))
    outputs = {t["name"]: tensor_from_json(t) for t in doc.get("outputs", [])}
    return Result(doc["custom_id"], outputs=outputs, model_version=str(doc.get("model_version", "")))


# -- JSONL ---------------------------------------------------------------------------------


class JsonlResults:
    """Results appended to one JSONL file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._done: set[str] = set()
        self._failed = 0
        path.parent.mkdir(parents=True, exist_ok=True)
        keep = 0
        if path.exists():
            with open(path, "rb") as f:
                data = f.read()
            for line in data.splitlines(keepends=True):
                if not line.endswith(b"\n"):
                    break  # cut short by a crash: dropped, its request runs again
                try:
                    doc = json.loads(line)
                    self._done.add(doc["custom_id"])
                except (ValueError, KeyError, TypeError):
                    break
                self._failed += "error" in doc
                keep += len(line)
            if keep != len(data):
                with open(path, "r+b") as f:
                    f.truncate(keep)
        self._file = open(path, "ab")

    def done(self) -> set[str]:
        return set(self._done)

    def counts(self) -> tuple[int, int]:
        """(succeeded, failed): the results held, as a resumed job counts them."""
        return len(self._done) - self._failed, self._failed

    def write(self, result: Result) -> None:
        if result.custom_id in self._done:
            return  # exactly one result per custom id
        # Written whole (one write of the line), made durable at the next sync: a
        # crash loses at most the unsynced tail, whose requests simply run again.
        self._file.write(json.dumps(result_json(result), separators=(",", ":")).encode() + b"\n")
        self._done.add(result.custom_id)
        self._failed += not result.ok

    def sync(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        if not self._file.closed:
            self.sync()
            self._file.close()


def read_jsonl(path: Path) -> Iterator[Result]:
    """The complete results of a JSONL file (a line cut short is skipped)."""
    if not path.exists():
        return
    with open(path, "rb") as f:
        for line in f:
            if line.endswith(b"\n"):
                yield result_from_json(json.loads(line))


def npz_bytes(results: Iterator[Result]) -> bytes:
    arrays: dict[str, np.ndarray] = {}
    errors: dict[str, str] = {}
    for r in results:
        if r.error is not None:
            errors[r.custom_id] = r.error
            continue
        for name, array in (r.outputs or {}).items():
            arrays[f"{r.custom_id}/{name}"] = array
    arrays[ERRORS_KEY] = np.array(json.dumps(errors))
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]  # numpy's stubs miss **kwds arrays
    return buffer.getvalue()


# -- Parquet ----------------------------------------------------------------------------------


def parquet_available() -> bool:
    try:
        import pyarrow  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        return False
    return True


class ParquetResults:
    """Results as a folder of Parquet files, one per sync (pyarrow)."""

    def __init__(self, folder: Path) -> None:
        import pyarrow.parquet as pq

        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.glob("*.tmp"):
            stale.unlink()  # a part a crash left half-written: its results run again
        self._done: set[str] = set()
        self._parts = 0
        for part in sorted(folder.glob("part-*.parquet")):
            self._parts += 1
            self._done.update(pq.read_table(part, columns=["custom_id"]).column("custom_id").to_pylist())
        self._pending: list[Result] = []

    def done(self) -> set[str]:
        return self._done | {r.custom_id for r in self._pending}

    def write(self, result: Result) -> None:
        if result.custom_id not in self._done:
            self._pending.append(result)

    def sync(self) -> None:
        if not self._pending:
            return
        import pyarrow as pa
        import pyarrow.parquet as pq

        columns: dict[str, list[Any]] = {"custom_id": [], "model_version": [], "error": []}
        names = sorted({n for r in self._pending for n in (r.outputs or {})})
        for name in names:
            columns[name] = []
            columns[f"{name}__shape"] = []
        for r in self._pending:
            columns["custom_id"].append(r.custom_id)
            columns["model_version"].append(r.model_version or None)
            columns["error"].append(r.error)
            for name in names:
                array = (r.outputs or {}).get(name)
                columns[name].append(None if array is None else _values(array))
                columns[f"{name}__shape"].append(None if array is None else list(array.shape))
        self._parts += 1
        final = self.folder / f"part-{self._parts:06d}.parquet"
        tmp = final.with_name(final.name + ".tmp")
        pq.write_table(pa.table(columns), tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        tmp.replace(final)
        self._done.update(r.custom_id for r in self._pending)
        self._pending.clear()

    def close(self) -> None:
        self.sync()


def _values(array: np.ndarray) -> list[Any]:
    flat = array.reshape(-1)
    if flat.dtype.kind == "O":
        return [x if isinstance(x, bytes) else str(x).encode() for x in flat]
    return flat.tolist()
