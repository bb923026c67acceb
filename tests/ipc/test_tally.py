"""inferd.ipc.tally: per-process counts in one shared page, each slot written by its owner, read by all."""

from __future__ import annotations

import os
import subprocess
import sys

from inferd.ipc.tally import Tally


def test_each_slot_is_its_owners_and_the_others_sum_is_what_is_fresh() -> None:
    tally = Tally.create(3)
    try:
        tally.write(0, 100, 5_000)
        tally.write(1, 20, 9_000)
        tally.write(2, 7, 10_000)
        assert tally.others(0, since_ns=0) == 27
        assert tally.others(1, since_ns=0) == 107
        assert tally.others(0, since_ns=9_500) == 7  # slot 1's count is older than asked: stale
        tally.clear(2)
        assert tally.others(0, since_ns=0) == 20
    finally:
        tally.close()


def test_a_child_process_sees_and_writes_the_same_page() -> None:
    tally = Tally.create(2)
    try:
        tally.write(0, 41, 1)
        code = ("import sys; from inferd.ipc.tally import Tally; t = Tally(int(sys.argv[1]), 2); "
                "assert t.others(1, 0) == 41; t.write(1, 9, 2)")
        subprocess.run([sys.executable, "-c", code, str(tally.fd)], check=True, pass_fds=(tally.fd,),
                       env={**os.environ})
        assert tally.others(0, since_ns=0) == 9
    finally:
        tally.close()
