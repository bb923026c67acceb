"""inferd/observability/collector.py: a server's start-up objects stay out of the cyclic collector's
full collections (they are walked on every one, with the GIL held), what it loads later does not, and
a stopped server gives them back to the collector."""

from __future__ import annotations

import gc
import shutil
from pathlib import Path

from inferd.observability import collector
from inferd.serve.one_process import InferenceServer, ServerOptions


def _collected(obj: object) -> bool:
    """Whether a collection may walk ``obj`` (gc.get_objects lists generations 0-2, never the frozen one)."""
    return any(o is obj for o in gc.get_objects())


def test_freeze_puts_what_exists_out_of_collections_and_thaw_brings_it_back() -> None:
    class Kept:
        pass

    kept = Kept()
    try:
        assert collector.freeze() == gc.get_freeze_count() > 0
        assert not _collected(kept)
        after = Kept()
        assert _collected(after)
    finally:
        collector.thaw()
    assert gc.get_freeze_count() == 0 and _collected(kept)


async def test_a_server_freezes_its_start_up_before_its_models_and_thaws_at_stop(example_repository: Path,
                                                                                tmp_path: Path) -> None:
    shutil.copytree(example_repository / "simple", tmp_path / "repo" / "simple")
    server = InferenceServer(ServerOptions(model_repositories=[tmp_path / "repo"], grpc_port=0, address="127.0.0.1",
                                           allow_http=False, allow_metrics=False, model_host="inline"))
    assert gc.get_freeze_count() == 0
    await server.start()
    try:
        assert gc.get_freeze_count() > 10_000  # the modules' objects, at least
        assert not _collected(server.dataplane)  # made before start: frozen
        entry = server.manager.known["simple"]
        model = entry.latest
        assert model is not None and _collected(model)  # loaded after: its cycles can still be collected
    finally:
        await server.stop(1.0)
    assert gc.get_freeze_count() == 0 and _collected(server.dataplane)
