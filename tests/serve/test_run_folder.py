"""The gRPC front's run folder: removed by its server at a stop, and by the next server when its own was
killed (a killed process cannot remove anything; the kernel drops its lock)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from inferd.serve.grpc_front import HELD, RunFolder, sweep_run_folders

_HOLDER = """
import sys
from pathlib import Path
from inferd.serve.grpc_front import RunFolder
folder = RunFolder(Path(sys.argv[1]))
print(folder.path, flush=True)
sys.stdin.read()  # holds the folder until killed
"""


def _holder(root: Path) -> tuple[subprocess.Popen, Path]:
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(root)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, Path(proc.stdout.readline().strip())


def test_a_killed_servers_folder_is_removed_by_the_next_and_a_live_ones_is_kept(tmp_path: Path) -> None:
    killed, killed_folder = _holder(tmp_path)
    live, live_folder = _holder(tmp_path)
    being_made = tmp_path / "inferd-front-being-made"  # mkdtemp done, its lock not yet in place
    being_made.mkdir()
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=30)
        assert (killed_folder / HELD).exists()  # nothing removed it

        mine = RunFolder(tmp_path)
        assert not killed_folder.exists()
        assert (live_folder / HELD).exists()
        assert being_made.exists()
        assert sweep_run_folders(tmp_path) == 0  # the new folder is held by this process

        mine.remove()
        assert not mine.path.exists()
    finally:
        for proc in (killed, live):
            proc.kill()
            proc.wait(timeout=30)
    assert sweep_run_folders(tmp_path) == 1  # the live holder, now killed too
    assert not live_folder.exists()
