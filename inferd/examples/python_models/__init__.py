"""Sources of the example Python models (``model.py`` files, written verbatim
into the example repository by :mod:`inferd.examples.build`)."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent


def source(name: str) -> bytes:
    """The bytes of ``<name>.py`` in this folder."""
    return (HERE / f"{name}.py").read_bytes()
