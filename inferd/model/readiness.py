"""A model's own readiness check (a Python model's ``is_ready``), asked when a client asks
whether the model is ready (ModelReady, ``GET /v2/models/<model>/ready``), as Triton does.

Each instance with a check (:attr:`~inferd.backends.base.ModelInstance.ready_check`) runs it on
a thread of the loop's default pool; the model is ready when every one answers True within
:data:`CHECK_TIMEOUT_S` (Triton's five seconds). One check per instance runs at a time:
questions that arrive meanwhile share its answer, so a check that hangs holds one thread,
however often clients ask. A check that raises, times out or answers something else is "not
ready", logged with the model's name.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from inferd.model.loaded import Model

log = logging.getLogger(__name__)

CHECK_TIMEOUT_S = 5.0

_running: dict[int, asyncio.Future] = {}  # id(instance) -> its check in flight


async def user_ready(model: Model, timeout_s: float = CHECK_TIMEOUT_S) -> bool:
    """Whether every instance of ``model`` that has a check of its own says it is ready."""
    instances = [w.instance for w in getattr(model.scheduler, "workers", ()) if w.instance.ready_check is not None]
    if not instances:
        return True
    answers = await asyncio.gather(*(_ask(model, instance, timeout_s) for instance in instances))
    return all(answers)


async def _ask(model: Model, instance: Any, timeout_s: float) -> bool:
    key = id(instance)
    future = _running.get(key)
    if future is None:
        future = _running[key] = asyncio.get_running_loop().run_in_executor(None, instance.ready_check)
        future.add_done_callback(lambda f: _running.pop(key, None) if _running.get(key) is f else None)
    try:
        return bool(await asyncio.wait_for(asyncio.shield(future), timeout_s))
    except asyncio.TimeoutError:
        log.warning("model '%s' instance %s: is_ready() did not answer within %.3g s; not ready",
                    model.name, instance.name, timeout_s)
    except Exception as exc:
        message = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
        log.warning("model '%s' instance %s: is_ready() failed (%s); not ready", model.name, instance.name, message)
    return False
