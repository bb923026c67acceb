"""inferd.backends.python: which model files the config step imports (to run auto_complete_config)."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferd.backends.python import _plainly_without_auto_complete

PLAIN = """
import torch

class TritonPythonModel:
    def execute(self, requests):
        return []
"""


@pytest.mark.parametrize("source, skipped", [
    (PLAIN, True),
    (PLAIN + "\n    @staticmethod\n    def auto_complete_config(c):\n        return c\n", False),
    (PLAIN.replace("TritonPythonModel:", "TritonPythonModel(Base):"), False),  # a base may complete it
    (PLAIN.replace("def execute", "def run"), False),  # the import names what is missing
    (PLAIN.replace("class TritonPythonModel", "class Other"), False),
    (PLAIN + "\ndef broken(:\n", False),  # the import reports the syntax error
    ("setattr(object, 'auto_complete_config', 1)\n" + PLAIN, False),
])
def test_only_a_model_with_nothing_to_complete_is_not_imported(tmp_path: Path, source: str, skipped: bool) -> None:
    path = tmp_path / "model.py"
    path.write_text(source)
    assert _plainly_without_auto_complete(path) is skipped


def test_the_scan_parses_one_file_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two Python models are prepared on two threads at once; CPython 3.11's ast.parse keeps its
    recursion count per interpreter, and two parses at once failed one with a SystemError."""
    import ast

    from inferd.backends import python as backend

    held: list[bool] = []
    parse = ast.parse

    def checked(*args, **kwargs):  # type: ignore[no-untyped-def]
        lock = getattr(backend, "_PARSE", None)
        held.append(lock is not None and lock.locked())
        return parse(*args, **kwargs)

    path = tmp_path / "model.py"
    path.write_text(PLAIN)
    monkeypatch.setattr(ast, "parse", checked)
    skipped = _plainly_without_auto_complete(path)
    monkeypatch.undo()  # pytest parses sources itself to report a failure
    assert skipped and held == [True]
