"""Optimised ONNX models kept between loads of the same file (issue 28).

Building an ONNX Runtime session parses the model and runs the graph optimisations inside one
call that holds the GIL the whole time (onnxruntime's Python binding releases it in ``run``, not
while a session is built), so the event loop waits for each load's build. ``on_demand`` loads the
same files again and again (an evicted model comes back), so a file whose first build was slow
(timed: ``min_build_ms``) has its second build save the optimised graph in ORT format
(``SessionOptions.optimized_model_filepath``), and later builds load that with optimisation off:
no protobuf parse, no optimiser.

An entry is keyed by everything that decides what the optimiser wrote: the model file's identity
(its path, device, inode, size, modification and change times, and those of every file in its
version folder, where external data lives: a rewritten file is a new key, and its older entries are
deleted when the new one is stored), the optimisation level, ONNX Runtime's
version and this CPU (optimisations at ``ORT_ENABLE_ALL`` may use its instruction set). Entries are
written under a temporary name and renamed into place, so a reader never sees half a file; the
folder is kept under ``max_bytes`` by deleting the least recently used entries. Only CPU sessions
are cached: a GPU provider's optimisations depend on the device and its drivers.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import shutil
import tempfile
import threading
from pathlib import Path

log = logging.getLogger(__name__)

SUFFIX = ".ort"
DEFAULT_MAX_BYTES = 1 << 30
# Measured (bench/load_gil.py): the 2 MB table model builds in 0.5-2 ms either way (and its saving
# build took 9 ms), the example text encoder in 10-17 ms from its .onnx and 3-5 ms from the stored model.
MIN_BUILD_MS = 4.0


@functools.cache
def _machine() -> str:
    """This CPU as the optimiser sees it: its model name and feature flags."""
    name = flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not name:
                    name = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = value.strip()
                if name and flags:
                    break
    except OSError:
        pass
    return f"{platform.machine()}|{name}|{flags}"


class SessionCache:
    """A folder of optimised models (ORT format); safe to share between threads and processes.

    ``folder``: where the entries live (created if missing); None makes a temporary folder of
    this cache's own, removed by :meth:`close`. ``max_bytes``: what the entries may hold together;
    ``min_build_ms``: only a file whose build from the model took this much CPU time or more is
    stored, by its next build (which saves the optimised graph as it builds): for a quicker one the
    stored model loads no faster, and the saving costs more than it gives back."""

    def __init__(self, folder: Path | None = None, max_bytes: int = DEFAULT_MAX_BYTES,
                 min_build_ms: float = MIN_BUILD_MS) -> None:
        if max_bytes < 1:
            raise ValueError(f"the session cache's size must be >= 1 byte, got {max_bytes}")
        self._owned = folder is None
        self._folder = None if folder is None else Path(folder)
        if self._folder is not None:
            self._folder.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.min_build_ns = int(min_build_ms * 1e6)
        self._slow: set[str] = set()  # keys whose build from the model took min_build_ms or more
        self.hits = 0
        self.stores = 0
        self._lock = threading.Lock()

    @property
    def folder(self) -> Path:
        """The entries' folder, made on first use (a temporary one is made only if a load needs it)."""
        with self._lock:
            if self._folder is None:
                self._folder = Path(tempfile.mkdtemp(prefix="inferd-sessions-"))
            return self._folder

    def key(self, model_file: Path, folder: Path, level: str, runtime_version: str) -> str | None:
        """The entry name for ``model_file`` built at optimisation ``level``: ``folder`` (its version
        folder) is part of its identity, for the external data files a model may keep beside it.
        None when they cannot be read."""
        try:
            path = os.path.realpath(model_file)
            files = []
            for root, _, names in os.walk(folder):
                for name in names:
                    st = os.stat(os.path.join(root, name))
                    files.append((os.path.relpath(os.path.join(root, name), folder), st.st_dev, st.st_ino,
                                  st.st_size, st.st_mtime_ns, st.st_ctime_ns))
            st = os.stat(path)
        except OSError:
            return None
        identity = (path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, sorted(files))
        settings = (level, runtime_version, _machine())
        where = hashlib.sha256(path.encode()).hexdigest()[:16]
        what = hashlib.sha256(repr((identity, settings)).encode()).hexdigest()[:32]
        return f"{where}-{what}"

    def lookup(self, key: str) -> Path | None:
        """The stored entry for ``key`` (its use recorded), or None."""
        path = self.folder / (key + SUFFIX)
        try:
            os.utime(path)  # least recently used goes first
        except OSError:
            return None
        with self._lock:
            self.hits += 1
        return path

    def timed(self, key: str, build_ns: int) -> None:
        """A build of ``key`` from the model file took ``build_ns`` of CPU time."""
        if build_ns >= self.min_build_ns:
            with self._lock:
                self._slow.add(key)

    def staging(self, key: str) -> Path | None:
        """A fresh temporary path in the folder to build ``key``'s entry at (then :meth:`store` it);
        None until a build of it from the model was timed slow enough to be worth storing."""
        if key not in self._slow:
            return None
        return self.folder / f"{key}.{os.getpid()}.{threading.get_ident()}.tmp{SUFFIX}"

    def store(self, key: str, staged: Path) -> None:
        """Move a staged entry into place; drop the entries of the same file's older contents, and the
        least recently used ones while the folder holds more than ``max_bytes``."""
        where = key.split("-", 1)[0]
        try:
            os.replace(staged, self.folder / (key + SUFFIX))
        except OSError as exc:
            log.warning("session cache: cannot store %s: %s", key, exc)
            discard(staged)
            return
        with self._lock:
            self.stores += 1
        for entry in self.folder.glob(f"{where}-*{SUFFIX}"):
            if entry.name != key + SUFFIX and ".tmp" not in entry.name:
                discard(entry)
        self.trim()

    def trim(self) -> None:
        entries = []
        for entry in self.folder.glob(f"*{SUFFIX}"):
            if ".tmp" in entry.name:
                continue
            try:
                st = entry.stat()
            except OSError:
                continue
            entries.append((st.st_mtime_ns, st.st_size, entry))
        total = sum(size for _, size, _ in entries)
        for _, size, entry in sorted(entries, key=lambda e: e[0]):
            if total <= self.max_bytes:
                break
            discard(entry)
            total -= size

    def size(self) -> int:
        """Bytes the stored entries hold now."""
        return sum(e.stat().st_size for e in self.folder.glob(f"*{SUFFIX}") if ".tmp" not in e.name)

    def close(self) -> None:
        """Remove the folder if this cache made it (a temporary one); an operator's folder stays."""
        if self._owned and self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None


def discard(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass
