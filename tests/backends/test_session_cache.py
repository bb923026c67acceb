"""The ONNX backend's session cache (issue 28): an optimised model stored by a slow file's second load
(the first is timed) is what a later load of the same file builds from; a quick one is never stored; a
changed file is never served from an entry of its old contents; the folder stays under its size and a
temporary one goes at close."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from inferd.backends.session_cache import SUFFIX, SessionCache
from inferd.examples.many_models import add_table_model, expected, table_model
from inferd.repository.manager import prepare
from inferd.repository.build import instance_specs


def _instance(folder: Path, cache: SessionCache | None):  # type: ignore[no-untyped-def]
    prepared = prepare(folder.name, folder)
    spec = instance_specs(prepared.spec, prepared.backend, folder, 1, folder / "1" / "model.onnx",
                          session_cache=cache)[0]
    return prepared.backend.create_instance(prepared.spec, spec)


def _answer(instance, i: int = 3) -> float:  # type: ignore[no-untyped-def]
    return float(instance.run({"I": np.array([i], dtype=np.int64)}, ["Y"])["Y"][0])


def _entries(cache: SessionCache) -> list[Path]:
    return sorted(p for p in cache.folder.glob(f"*{SUFFIX}") if ".tmp" not in p.name)


def _stored(folder: Path, cache: SessionCache) -> None:
    """Two loads: the first is timed (slow enough at min_build_ms=0), the second stores the entry."""
    for _ in range(2):
        _instance(folder, cache).close()


def _rewrite(path: Path, data: bytes) -> None:
    st = os.stat(path)
    path.write_bytes(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # a rewrite within the clock's tick too


def test_a_second_load_of_a_file_builds_from_the_stored_optimised_model(tmp_path: Path) -> None:
    cache = SessionCache(tmp_path / "cache", min_build_ms=0)
    folder = add_table_model(tmp_path / "repo", "m00", 0, 1000)
    first = _instance(folder, cache)
    assert _answer(first) == expected(0, 3)
    first.close()
    assert _entries(cache) == []  # timed, not stored
    _instance(folder, cache).close()
    (entry,) = _entries(cache)
    assert (cache.stores, cache.hits) == (1, 0)
    # Put another model's optimised graph in the entry: the next load answers with it, so it is what
    # was loaded (the model file itself was not read).
    other = add_table_model(tmp_path / "other", "m07", 7, 1000)
    scratch = SessionCache(tmp_path / "scratch", min_build_ms=0)
    _stored(other, scratch)
    os.replace(_entries(scratch)[0], entry)
    again = _instance(folder, cache)
    assert _answer(again) == expected(7, 3)
    assert cache.hits == 1
    again.close()


def test_a_changed_model_file_is_not_served_from_its_old_entry(tmp_path: Path) -> None:
    cache = SessionCache(tmp_path / "cache", min_build_ms=0)
    folder = add_table_model(tmp_path / "repo", "m00", 0, 1000)
    _stored(folder, cache)
    old = _entries(cache)
    _rewrite(folder / "1" / "model.onnx", table_model(5, 1000))
    for _ in range(2):  # timed, then stored: never the old contents' entry
        changed = _instance(folder, cache)
        assert _answer(changed) == expected(5, 3)
        changed.close()
    assert cache.hits == 0 and cache.stores == 2
    (now,) = _entries(cache)  # the old contents' entry was dropped
    assert now not in old


def test_a_damaged_entry_is_built_again_from_the_model_file(tmp_path: Path) -> None:
    cache = SessionCache(tmp_path / "cache", min_build_ms=0)
    folder = add_table_model(tmp_path / "repo", "m00", 0, 1000)
    _stored(folder, cache)
    _entries(cache)[0].write_bytes(b"not an ORT model")
    again = _instance(folder, cache)
    assert _answer(again) == expected(0, 3)
    again.close()
    assert cache.stores == 2 and len(_entries(cache)) == 1


def test_the_folder_stays_under_its_size_and_a_temporary_one_goes_at_close(tmp_path: Path) -> None:
    probe = SessionCache(tmp_path / "probe", min_build_ms=0)
    _stored(add_table_model(tmp_path / "repo", "m00", 0, 20_000), probe)
    one = probe.size()
    cache = SessionCache(max_bytes=int(one * 2.5), min_build_ms=0)  # a temporary folder: two entries fit
    names = []
    for i in range(1, 6):
        folder = add_table_model(tmp_path / "repo", f"m{i:02d}", i, 20_000)
        _stored(folder, cache)
        names.append(cache.key(folder / "1" / "model.onnx", folder / "1", "ORT_ENABLE_ALL",
                               __import__("onnxruntime").__version__))
        assert cache.size() <= cache.max_bytes
    assert [p.name for p in _entries(cache)] == sorted(n + SUFFIX for n in names[-2:])  # the newest stay
    folder = cache.folder
    cache.close()
    assert not folder.exists()
    with pytest.raises(ValueError, match="must be >= 1 byte, got 0"):
        SessionCache(tmp_path / "x", max_bytes=0)


def test_a_build_too_quick_to_gain_is_never_stored(tmp_path: Path) -> None:
    cache = SessionCache(tmp_path / "cache", min_build_ms=10_000)  # no build here takes 10 s of CPU
    folder = add_table_model(tmp_path / "repo", "m00", 0, 1000)
    for _ in range(3):
        instance = _instance(folder, cache)
        assert _answer(instance) == expected(0, 3)
        instance.close()
    assert _entries(cache) == [] and not list(cache.folder.iterdir())
    assert (cache.stores, cache.hits) == (0, 0)
    key = cache.key(folder / "1" / "model.onnx", folder / "1", "ORT_ENABLE_ALL", __import__("onnxruntime").__version__)
    assert key is not None and cache.staging(key) is None
