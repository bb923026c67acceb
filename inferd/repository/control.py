"""Model control as Triton: the modes, the repository poller, load parameters.

``--model-control-mode none`` (default) loads every model at start-up and
refuses RepositoryModelLoad/Unload; ``explicit`` loads the ``--load-model``
models (``*``: all) and then obeys RepositoryModelLoad/Unload; ``on_demand``
loads a model on its first request and evicts the coldest under
``--model-memory-budget`` (:mod:`inferd.repository.demand`; RepositoryModelLoad
pins, Unload unpins); ``poll``
loads everything and rescans the repositories every
``--repository-poll-secs``: a new model folder is loaded, a changed one
(files added, removed or modified: a new version, a new config) is reloaded,
a removed one is unloaded. A failed (re)load is reported in the index and
retried only when the folder changes again; the poller keeps going.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Mapping

from inferd.config import ModelConfig, config_from_json
from inferd.errors import InferdError, InvalidArgument, Unimplemented
from inferd.repository.overrides import FILE_PREFIX
from inferd.repository.layout import fingerprint, scan
from inferd.repository.manager import ModelManager

log = logging.getLogger(__name__)


def check_arguments(mode: str, load_models: list[str], poll_secs: float,
                    memory_budget: int | None = None) -> str | None:
    """Why the options do not fit together, or None."""
    if load_models and mode not in ("explicit", "on_demand"):
        return "--load-model needs --model-control-mode explicit (or on_demand, where it pins the model)"
    if memory_budget is not None and mode != "on_demand":
        return ("--model-memory-budget needs --model-control-mode on_demand (the other modes never unload a "
                f"model on their own), got --model-control-mode {mode}")
    if mode == "poll" and not poll_secs > 0:
        return f"--repository-poll-secs must be > 0, got {poll_secs}"
    return None


def require_explicit(manager: ModelManager, what: str) -> None:
    """Refuse RepositoryModelLoad/Unload unless the mode obeys them (explicit, on_demand)."""
    if manager.mode not in ("explicit", "on_demand"):
        if manager.mode == "poll":
            raise Unimplemented(
                f"{what}: explicit model load / unload is not allowed if polling is enabled "
                "(this server runs with --model-control-mode poll)")
        raise Unimplemented(
            f"{what}: explicit model load / unload is not supported in model control mode none; "
            "start the server with --model-control-mode explicit")


def load_parameters(name: str, params: Mapping[str, object]) -> tuple[ModelConfig | None, dict[str, object]]:
    """RepositoryModelLoad's parameters: ``config`` (a JSON ModelConfig used instead of
    config.pbtxt) and the model files sent in the request (``file:<relative path>``: the
    bytes of each file of an override model folder, :mod:`inferd.repository.overrides`)."""
    config = None
    files: dict[str, object] = {}
    for key, value in params.items():
        if key == "config":
            if not isinstance(value, str):
                raise InvalidArgument(f"failed to load '{name}': parameter 'config' must be a JSON string")
            config = config_from_json(name, value)
        elif key.startswith(FILE_PREFIX):
            files[key] = value  # checked where the folder is written, as Triton does
        else:
            raise InvalidArgument(
                f"failed to load '{name}': unknown parameter '{key}' (known: config, file:<relative path>)")
    return config, files


def unload_parameters(name: str, params: Mapping[str, object]) -> bool:
    """RepositoryModelUnload's parameters: ``unload_dependents`` (bool)."""
    dependents = False
    for key, value in params.items():
        if key == "unload_dependents":
            if not isinstance(value, bool):
                raise InvalidArgument(f"failed to unload '{name}': parameter 'unload_dependents' must be a bool")
            dependents = value
        else:
            raise InvalidArgument(f"failed to unload '{name}': unknown parameter '{key}' (known: unload_dependents)")
    return dependents


class RepositoryPoller:
    """Poll mode: rescan the repositories and bring the loaded models in line."""

    def __init__(self, manager: ModelManager, interval: float) -> None:
        self.manager = manager
        self.interval = interval
        self._task: asyncio.Task | None = None
        self.polls = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="inferd-repository-poll")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.poll()
            except asyncio.CancelledError:
                raise
            except Exception:  # the poller must outlive any one bad scan
                log.exception("repository poll failed; trying again in %.3g s", self.interval)

    async def poll(self) -> None:
        """One rescan: load new models, reload changed ones, unload removed ones."""
        manager = self.manager
        loop = asyncio.get_running_loop()
        try:
            found = await loop.run_in_executor(None, scan, manager.repositories)
        except InferdError as exc:
            log.error("repository poll: %s", exc.message)
            return
        known = manager.entries()
        for name in known:
            if name not in found:
                log.info("repository poll: model '%s' was removed; unloading it", name)
                await manager.forget(name)
        for name, path in found.items():
            entry = known.get(name)
            if entry is not None:
                old_path, old_print, _wanted = entry
                if path != old_path:  # moved to another repository: a new model there
                    await manager.forget(name)
                else:
                    now = await loop.run_in_executor(None, fingerprint, path)
                    if now == old_print:
                        continue
                    log.info("repository poll: model '%s' changed; reloading it", name)
            else:
                log.info("repository poll: new model '%s'; loading it", name)
            try:
                await manager.load_model(name)
            except InferdError as exc:
                log.error("repository poll: %s", exc.message)
        self.polls += 1
