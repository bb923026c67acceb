"""Every README example runs as written against real servers (tests/readme_examples.py;
.ci/run also runs it right after `make serve`'s install, before the test extras)."""

from __future__ import annotations

from pathlib import Path

import pytest

from readme_examples import ROOT, blocks, run_readme


def test_the_readme_has_runnable_examples_for_each_step_of_the_quick_start() -> None:
    found = blocks((ROOT / "README.md").read_text())
    runnable = [b for b in found if b.lang in ("sh", "python")]
    assert any(b.text.startswith("# file: models/") for b in runnable)  # a Python class in a folder
    assert any(b.text.startswith("inferd serve ") for b in runnable)
    assert any("import requests" in b.text for b in runnable) and any("inferd_client" in b.text for b in runnable)


@pytest.mark.timeout(900)
def test_every_readme_example_runs(example_repository: Path) -> None:
    lines: list[str] = []
    ran = run_readme(ROOT / "README.md", example_repository, log=lines.append)
    assert ran >= 5, lines


def test_a_wrong_printed_output_fails_the_run(tmp_path: Path, example_repository: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("```python\nprint(1 + 1)\n```\n```output\n3\n```\n")
    with pytest.raises(RuntimeError, match="instead of"):
        run_readme(readme, example_repository, log=lambda _: None)
