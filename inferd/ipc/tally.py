"""A few counters shared by the processes of one server: one slot per process, each written by its owner.

The gRPC door (:mod:`inferd.frontends.door`) bounds the calls a whole server holds, and in the default
process mode those calls are spread over frontend workers that cannot see each other's. Each worker
writes its own count, with the time it was counted, into its slot of one shared page, and reads every
slot to know the server's total: no message, no lock (one writer per slot; an 8-byte store is whole on
the machines inferd runs on, and a value read beside an older stamp is at worst one sample stale).

The page is a ``memfd_create`` file made by the core, inherited by every worker (``pass_fds``), the same
file for a worker restarted in the slot of one that died (:meth:`Tally.clear` zeroes a dead worker's slot).
"""

from __future__ import annotations

import mmap
import os

import numpy as np

SLOT_FIELDS = 2  # value, stamp (CLOCK_MONOTONIC ns when the value was counted; 0: never)


class Tally:
    """``slots`` pairs of int64 in a shared mapping of ``fd``."""

    __slots__ = ("fd", "slots", "_buf", "table")

    def __init__(self, fd: int, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"a tally needs at least one slot, got {slots}")
        self.fd = fd
        self.slots = slots
        size = max(mmap.PAGESIZE, slots * SLOT_FIELDS * 8)
        self._buf = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.table = np.frombuffer(self._buf, dtype=np.int64, count=slots * SLOT_FIELDS).reshape(slots, SLOT_FIELDS)

    @classmethod
    def create(cls, slots: int, name: str = "inferd-tally") -> "Tally":
        """A new zeroed tally; its fd is inheritable (pass it to the workers with ``pass_fds``)."""
        fd = os.memfd_create(name, 0)  # not MFD_CLOEXEC: the workers inherit it
        try:
            os.ftruncate(fd, max(mmap.PAGESIZE, slots * SLOT_FIELDS * 8))
            return cls(fd, slots)
        except BaseException:
            os.close(fd)
            raise

    def write(self, slot: int, value: int, stamp_ns: int) -> None:
        """The owner of ``slot`` counted ``value`` at ``stamp_ns``."""
        row = self.table[slot]
        row[0] = value
        row[1] = stamp_ns

    def others(self, slot: int, since_ns: int) -> int:
        """The sum of every other slot's value counted at ``since_ns`` or later (older ones are stale:
        a process that counts nothing new is idle, or gone)."""
        table = self.table
        fresh = table[:, 1] >= since_ns
        fresh[slot] = False
        return int(table[fresh, 0].sum())

    def clear(self, slot: int) -> None:
        """The owner of ``slot`` is gone: its count no longer holds anything."""
        self.write(slot, 0, 0)

    def close(self) -> None:
        self.table = np.empty((0, SLOT_FIELDS), np.int64)
        try:
            self._buf.close()
        except BufferError:
            pass
        try:
            os.close(self.fd)
        except OSError:
            pass
