"""Who owns a change that is live but not yet proven, and how to tell that owner is gone.

A change the loop applies in order to verify it is owned until it is kept or undone. Two kinds
of owner:

- :class:`ProcessOwner`: the process verifying it, named by its host, its pid and the pid's
  start time (a pid the kernel reuses for another process is not mistaken for the owner). It
  holds a lease that it renews while it works
  (:mod:`agentmend.infrastructure.changes.protocol.leases`).
- :class:`RecordOwner`: a record in the store that keeps the change live on purpose (a watch on
  live traffic, a rollout serving a canary share). It does not expire with a process: recovery
  leaves it to the record's own logic rather than rolling it back.

A host is its host name plus the kernel's boot id and the machine id (``/etc/machine-id``).
Linux only for the pid checks (``/proc``); elsewhere a process owner is judged by its lease's
expiry alone. Assumptions, stated once: a host name names one pid namespace (a container gets
its own host name by default), and the clocks of hosts sharing a store agree within
``LeaseTerms.clock_skew_s`` (NTP keeps them within milliseconds).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from functools import cache
from pathlib import Path

__all__ = [
    "HostIdentity",
    "LeaseTerms",
    "Owner",
    "ProcessOwner",
    "RecordOwner",
    "process_alive",
    "process_start",
]


@dataclass(frozen=True, slots=True)
class LeaseTerms:
    """How long a process owner's lease lasts and how often the owner renews it.

    Attributes:
        ttl_s: a lease not renewed for this long has expired (default 30 s).
        renew_every_s: how often the owner renews (default 5 s: five renewals may be missed
            before the lease expires, so a busy moment never costs the owner its work).
        clock_skew_s: how far another host's clock may be ahead of the owner's; another host
            takes a lease as expired only this long after its expiry (default 5 s).
    """

    ttl_s: float = 30.0
    renew_every_s: float = 5.0
    clock_skew_s: float = 5.0


@dataclass(frozen=True, slots=True)
class HostIdentity:
    """The machine a process runs on, as far as pids and files are concerned."""

    hostname: str
    boot_id: str
    machine_id: str

    @staticmethod
    def current() -> HostIdentity:
        """This process's host (read once per process)."""
        return _current_host()

    def same_boot(self, other: HostIdentity) -> bool:
        """Whether pids of ``other`` mean the same processes here: same kernel boot, same host
        name (standing in for the pid namespace)."""
        return bool(self.boot_id) and self.boot_id == other.boot_id and self.same_name(other)

    def same_host(self, other: HostIdentity) -> bool:
        """Whether ``other`` is this machine, across reboots too: the files it wrote are here."""
        if not self.same_name(other):
            return False
        if self.boot_id and self.boot_id == other.boot_id:
            return True
        return bool(self.machine_id) and self.machine_id == other.machine_id

    def same_name(self, other: HostIdentity) -> bool:
        return self.hostname == other.hostname

    def __str__(self) -> str:
        return self.hostname


@cache
def _current_host() -> HostIdentity:
    return HostIdentity(
        hostname=socket.gethostname(),
        boot_id=_read_first(Path("/proc/sys/kernel/random/boot_id")),
        machine_id=_read_first(Path("/etc/machine-id"), Path("/var/lib/dbus/machine-id")),
    )


def _read_first(*paths: Path) -> str:
    for path in paths:
        try:
            return path.read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError):
            continue
    return ""


@dataclass(frozen=True, slots=True)
class ProcessOwner:
    """A process verifying a change: its host, pid and the pid's start time.

    ``start`` is the start time in clock ticks since boot (``/proc/<pid>/stat``, field 22);
    None where ``/proc`` is not available.
    """

    host: HostIdentity
    pid: int
    start: int | None

    @staticmethod
    def current() -> ProcessOwner:
        """This process, on this host."""
        pid = os.getpid()
        return ProcessOwner(HostIdentity.current(), pid, process_start(pid))

    def alive_seen_from(self, host: HostIdentity) -> bool | None:
        """Whether this owner still runs, as a process on ``host`` can tell.

        True or False when ``host`` shares this owner's kernel boot and pid namespace; None
        when it cannot tell (another host, or no ``/proc``): the lease's expiry decides then.
        """
        if not host.same_boot(self.host):
            return None
        if self.start is None:
            return None
        return process_alive(self.pid, self.start)

    def __str__(self) -> str:
        return f"pid {self.pid} on {self.host}"


@dataclass(frozen=True, slots=True)
class RecordOwner:
    """A record in the store that keeps a change live on purpose (a watch or a rollout).

    Attributes:
        kind: what the record is (``"watch"``, ``"rollout"``).
        record_id: its id in its own table.
    """

    kind: str
    record_id: str

    def __str__(self) -> str:
        return f"{self.kind} {self.record_id}"


Owner = ProcessOwner | RecordOwner
"""Whoever holds a lease: a process (expires) or a record (continued by its own logic)."""


def _stat_fields(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` from field 3 on (after the command name), None if unreadable."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    # the command name (field 2) is in parentheses and may itself hold ') '
    return text[text.rfind(")") + 2 :].split()


def process_start(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot; None if it cannot be read."""
    fields = _stat_fields(pid)
    if fields is None or len(fields) < 20:
        return None
    return int(fields[19])  # field 22 of the line; fields[0] is field 3


def process_alive(pid: int, start: int) -> bool:
    """Whether ``pid`` runs and is the process that started at ``start``.

    A zombie (killed, not yet reaped) is dead: it will never write again. A stopped process
    (SIGSTOP) is alive: it may resume, which is why its lease's expiry still applies.
    """
    fields = _stat_fields(pid)
    if fields is None or len(fields) < 20:
        return False
    if fields[0] in ("Z", "X", "x"):
        return False
    return int(fields[19]) == start
