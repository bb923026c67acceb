"""RepositoryModelLoad with model files in the request: the override model folder.

As Triton: when the load parameters carry ``file:<relative path>`` entries (the model's
files, e.g. ``file:1/model.onnx``), the model is loaded from a folder made of exactly those
files plus the ``config`` parameter (required then) written as config.pbtxt, instead of its
folder in the repository (a model need not be in the repository at all). Triton answers a
malformed override (no ``config``, a value that is not bytes, a path leaving the folder, a
name the file system refuses) with INTERNAL "failed to poll from model repository"; so does
inferd, with what was wrong and what would be valid after it.

The folders live under one temporary root per manager, one per load; the manager removes a
folder once the versions loaded from it are gone.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from pathlib import Path, PurePosixPath

from inferd.config import ModelConfig, config_to_text
from inferd.errors import RepositoryPollError

FILE_PREFIX = "file:"
NAME_MAX = 255  # bytes in one path component (Linux, and what Triton's file system calls hit)


def is_override(parameters: dict[str, object]) -> bool:
    return any(key.startswith(FILE_PREFIX) for key in parameters)


class OverrideFolders:
    """Where override folders are written; :meth:`close` removes them all."""

    def __init__(self) -> None:
        self._root: Path | None = None
        self._count = itertools.count(1)

    def write(self, name: str, config: ModelConfig | None, files: dict[str, object]) -> Path:
        """A new folder holding ``files`` and ``config``; raises RepositoryPollError. Blocking."""
        def fail(detail: str) -> RepositoryPollError:
            return RepositoryPollError(f"failed to load '{name}', failed to poll from model repository: {detail}")

        if config is None:
            raise fail("load parameter 'config' must be specified for model file override (the files "
                       "form the whole model folder; 'config' is its config.pbtxt, in JSON)")
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="inferd-overrides-"))
        folder = self._root / f"{next(self._count)}"
        folder.mkdir()
        try:
            (folder / "config.pbtxt").write_text(config_to_text(config))
            for key, content in files.items():
                _write_file(folder, key, content, fail)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        return folder

    def release(self, folder: Path | None) -> None:
        """Remove one folder written here (nothing else)."""
        if folder is not None and self._root is not None and folder.parent == self._root:
            shutil.rmtree(folder, ignore_errors=True)

    def close(self) -> None:
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None


def _write_file(folder: Path, key: str, content: object, fail) -> None:  # type: ignore[no-untyped-def]
    relative = key[len(FILE_PREFIX):]
    if not isinstance(content, bytes):
        raise fail(f"file parameter '{key}' must have bytes type for its value (the file's content), "
                   f"got {type(content).__name__}")
    parts = PurePosixPath(relative).parts
    if not relative or relative.startswith("/") or ".." in parts or not parts:
        raise fail(f"invalid file parameter '{key}': the path must be relative and stay within the model "
                   "folder (e.g. 'file:1/model.onnx')")
    long = next((p for p in parts if len(p.encode()) > NAME_MAX), None)
    if long is not None:
        raise fail(f"invalid file parameter '{key[:60]}...': a path component is {len(long.encode())} bytes "
                   f"long; the file system allows at most {NAME_MAX}")
    target = folder.joinpath(*parts)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "wb") as out:
            out.write(content)
    except (FileExistsError, NotADirectoryError, IsADirectoryError):
        raise fail(f"invalid file parameter '{key}': it names a folder as a file, or a file as a folder, "
                   "of another file parameter") from None
    except OSError as exc:
        raise fail(f"invalid file parameter '{key}': {os.strerror(exc.errno) if exc.errno else exc}") from None
