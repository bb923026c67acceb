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

:class:`ModelLoading` is the same control for a Python model's model loading
API (``pb_utils.load_model`` / ``unload_model`` / ``is_model_ready``), under
the same rules: explicit and on_demand modes only.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Mapping

from inferd.config import ModelConfig, config_from_json
from inferd.errors import InferdError, InvalidArgument, NotFound, Unimplemented
from inferd.model.readiness import user_ready
from inferd.repository.overrides import FILE_PREFIX
from inferd.repository.layout import fingerprint, scan

if TYPE_CHECKING:  # the manager builds a ModelLoading for its dispatcher: no import at run time
    from inferd.repository.manager import ModelManager

log = logging.getLogger(__name__)


def check_arguments(mode: str, load_models: list[str], poll_secs: float,
                    memory_budget: int | None = None,
                    gpu_memory_budget: Mapping[int, int] | None = None) -> str | None:
    """Why the options do not fit together, or None."""
    if load_models and mode not in ("explicit", "on_demand"):
        return "--load-model needs --model-control-mode explicit (or on_demand, where it pins the model)"
    if memory_budget is not None and mode != "on_demand":
        return ("--model-memory-budget needs --model-control-mode on_demand (the other modes never unload a "
                f"model on their own), got --model-control-mode {mode}")
    if gpu_memory_budget and mode != "on_demand":
        return ("--model-gpu-memory-budget needs --model-control-mode on_demand (the other modes never unload a "
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


class ModelLoading:
    """The model loading API of Python models (the manager's dispatcher holds one): what
    RepositoryModelLoad / Unload do, with the same mode rules and errors."""

    def __init__(self, manager: ModelManager) -> None:
        self.manager = manager
        self._unloads: set[asyncio.Task] = set()

    async def load(self, name: str, config: str, files: dict[str, bytes], caller: str = "") -> None:
        """``pb_utils.load_model`` (made by model ``caller``): returns once the model serves; raises why not."""
        require_explicit(self.manager, f"failed to load '{name}'")
        params: dict[str, object] = dict(files)
        if config:
            params["config"] = config
        parsed, folder = load_parameters(name, params)
        if self.manager.demand is not None:
            self.manager.demand.check_nested(name, caller, "asked (pb_utils.load_model) to load")
            await self.manager.demand.load_pinned(name, parsed, folder, caller=caller)
        else:
            await self.manager.load_model(name, parsed, folder, within=caller or None)

    async def unload(self, name: str, unload_dependents: bool) -> None:
        """``pb_utils.unload_model``: refuses new requests to ``name`` at once and returns; the
        accepted ones finish in the background (the caller may be one of them: waiting for them
        here would wait for itself)."""
        require_explicit(self.manager, f"failed to unload '{name}'")
        if name not in self.manager.entries():
            raise NotFound(f"failed to unload '{name}': no such model")
        demand = self.manager.demand
        work = (demand.unload(name, unload_dependents) if demand is not None
                else self.manager.unload_model(name, unload_dependents))
        task = asyncio.get_running_loop().create_task(work, name=f"inferd-unload-{name}")
        self._unloads.add(task)
        task.add_done_callback(self._unloaded)
        await asyncio.sleep(0)  # let it take the model's lock and refuse new requests, if it can at once

    def _unloaded(self, task: asyncio.Task) -> None:
        self._unloads.discard(task)
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            log.error("unloading a model for a Python model failed: %s",
                      exc.message if isinstance(exc, InferdError) else repr(exc))

    async def is_ready(self, name: str, version: int) -> bool:
        """``pb_utils.is_model_ready``: as ModelReady answers (Triton's ServerModelIsReady asks the
        model's own check too)."""
        if not self.manager.is_ready(name, version):
            return False
        return await user_ready(self.manager.get(name, version))


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
