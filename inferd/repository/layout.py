"""Triton's repository layout: ``<repo>/<model>/config.pbtxt`` and numeric
version folders (which of them a ``version_policy`` selects is the config's:
:func:`inferd.config.select_versions`)."""

from __future__ import annotations

import os
from pathlib import Path

from inferd.config import parse_config_file
from inferd.errors import ConfigError, InferdError


def check_repositories(repositories: list[Path]) -> list[Path]:
    """Raise ConfigError (one sentence) for a repository path that is missing or not a
    folder; return the repositories that hold no model folder (worth a warning)."""
    empty = []
    for repo in repositories:
        if not repo.exists():
            raise ConfigError(f"model repository '{repo}' does not exist")
        if not repo.is_dir():
            raise ConfigError(f"model repository '{repo}' is not a directory")
        if not scan([repo]):
            empty.append(repo)
    return empty


def scan(repositories: list[Path]) -> dict[str, Path]:
    """Model name -> model folder, over every repository folder given."""
    models: dict[str, Path] = {}
    for repo in repositories:
        if not repo.is_dir():
            raise ConfigError(f"model repository '{repo}' is not a directory")
        for child in sorted(repo.iterdir()):
            if not child.is_dir() or child.name.startswith("."):
                continue
            if child.name in models:
                raise ConfigError(
                    f"model '{child.name}' appears in two repositories: {models[child.name]} and {child}"
                )
            models[child.name] = child
    return models


def available_versions(model_dir: Path) -> list[int]:
    versions = []
    for child in model_dir.iterdir():
        if child.is_dir() and child.name.isdigit() and int(child.name) > 0:
            versions.append(int(child.name))
    return sorted(versions)


def fingerprint(model_dir: Path) -> tuple[tuple[str, int, int], ...]:
    """What a model folder holds: every file's path (relative, '/'-separated),
    size and modification time. Poll mode reloads a model when it changes."""
    items = []
    for root, dirs, files in os.walk(model_dir):
        dirs.sort()
        rel = os.path.relpath(root, model_dir)
        for name in sorted(files):
            path = os.path.join(root, name)
            try:
                st = os.stat(path)
            except OSError:  # removed while we looked
                continue
            key = name if rel == "." else f"{rel.replace(os.sep, '/')}/{name}"
            items.append((key, st.st_size, st.st_mtime_ns))
    return tuple(items)


def change_stamp(model_dir: Path) -> tuple[tuple[str, int, int], ...]:
    """What tells that a model folder changed, cheaply (a few stat calls, asked on the event loop for
    every request to a model whose load failed): the folder, its direct entries (config.pbtxt, the
    version folders) and what each version folder holds directly, by size and modification time.
    Deeper files are not looked at (:func:`fingerprint` walks them all); replacing one changes the
    modification time of the folder it is in only when it is renamed into place."""
    items: list[tuple[str, int, int]] = []

    def add(key: str, path: str) -> os.stat_result | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        items.append((key, st.st_size, st.st_mtime_ns))
        return st

    add(".", str(model_dir))
    try:
        top = sorted(os.scandir(model_dir), key=lambda e: e.name)
    except OSError:
        return tuple(items)
    for entry in top:
        add(entry.name, entry.path)
        if entry.name.isdigit() and entry.is_dir():
            try:
                inner = sorted(os.scandir(entry.path), key=lambda e: e.name)
            except OSError:
                continue
            for item in inner:
                add(f"{entry.name}/{item.name}", item.path)
    return tuple(items)


def pinned_in_config(name: str, model_dir: Path) -> bool:
    """Whether a model's config.pbtxt says ``inferd.pinned: true`` (read before it loads, on_demand's
    start-up; a config that does not parse is not pinned: its load reports it)."""
    try:
        config = parse_config_file(model_dir / "config.pbtxt", model=name)
    except (InferdError, OSError):
        return False
    param = config.parameters.get("inferd.pinned")
    return param is not None and param.string_value.strip().lower() in ("true", "1")
