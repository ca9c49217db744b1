"""A worker process for the crash and concurrency tests, and the checks run after it.

As a script it is the child: ``crash`` applies changes (single files, groups, rollbacks) until it
is killed and prints ``ACK <id>`` after each ``apply`` returns and ``RBK <id>`` after each
rollback returns, flushed, so the parent knows exactly what was acknowledged. ``concurrent``
does the same for a fixed count, on its own file and on files shared with its siblings, and
records an execution with the PerformanceMonitor after each change (``EXE <agent>``).

Imported, it gives the parent side: :func:`run_crash_trial` (start, kill with SIGKILL at a
random moment, reopen, check) and :func:`check_history` (no acknowledged change lost, no file
half-written or left over, files equal a replay of the history, audit chain verifies).
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from agentmend.infrastructure.changes.improvement_manager import (  # noqa: E402
    ChangeRecord,
    ChangeStatus,
    ChangeType,
    ImprovementAction,
    ImprovementManager,
)
from agentmend.infrastructure.errors import RollbackConflict  # noqa: E402

FILES = ("a.md", "b.md", "docs/c.md", "docs/d.md", "docs/deep/e.md", "f.md")
_MARK = b"\n#sha256="


def make_content(tag: str, rng: random.Random) -> bytes:
    """Content that proves it was written whole: a payload and its own checksum."""
    payload = (f"{tag} ".encode() * rng.randint(1, 400))[: rng.randint(1, 6000)]
    return payload + _MARK + hashlib.sha256(payload).hexdigest().encode() + b"\n"


def is_whole(data: bytes) -> bool:
    payload, mark, tail = data.rpartition(_MARK)
    return bool(mark) and tail == hashlib.sha256(payload).hexdigest().encode() + b"\n"


def initial_files(rng: random.Random) -> dict[str, bytes | None]:
    return {f: (make_content(f"initial {f}", rng) if rng.random() < 0.6 else None) for f in FILES}


def _action(agent: str) -> ImprovementAction:
    return ImprovementAction(
        target_agent=agent, action_type=ChangeType.PROMPT_MODIFICATION, confidence_score=0.9
    )


def quiet_logs() -> None:
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))


def _child_crash(db: Path, root: Path, seed: int, count: int) -> None:
    rng = random.Random(seed)
    manager = ImprovementManager(db)
    acked: list[str] = []
    print("READY", flush=True)
    for i in range(count):
        r = rng.random()
        if r < 0.6:
            content = None if rng.random() < 0.1 else make_content(f"c{i}", rng)
            record = manager.apply(
                _action("writer"), path=rng.choice(FILES), new_content=content, root=root
            )
            records = [record]
        elif r < 0.8:
            paths = rng.sample(FILES, rng.randint(2, 3))
            records = manager.apply_group(
                [(_action("team"), p, make_content(f"g{i}", rng)) for p in paths], root=root
            )
        else:
            if rng.random() < 0.5 and acked:
                target = rng.choice(acked)
                try:
                    if manager.rollback_by_id(target, cascade=rng.random() < 0.5):
                        print(f"RBK {target}", flush=True)
                except RollbackConflict:
                    pass
            else:
                try:
                    rolled = manager.rollback_last()
                except RollbackConflict:
                    rolled = None
                if rolled is not None:
                    print(f"RBK {rolled.change_id}", flush=True)
            continue
        for record in records:
            acked.append(record.change_id)
            print(f"ACK {record.change_id}", flush=True)


def _child_concurrent(db: Path, root: Path, worker: int, count: int) -> None:
    from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
    from agentmend.infrastructure.store.api import Store

    rng = random.Random(worker)
    store = Store(db)
    manager = ImprovementManager(store=store)
    monitor = PerformanceMonitor(store=store)
    print("READY", flush=True)
    sys.stdin.readline()  # start together
    for i in range(count):
        own = f"worker{worker}/own.md"
        path = own if i % 2 else rng.choice(("shared/x.md", "shared/y.md"))
        record = manager.apply(
            _action(f"agent-{worker}"),
            path=path,
            new_content=make_content(f"w{worker} {i}", rng),
            root=root,
        )
        print(f"ACK {record.change_id}", flush=True)
        monitor.record(f"agent-{worker}", success=i % 3 != 0, duration_ms=float(i))
        print(f"EXE agent-{worker}", flush=True)
    monitor.flush()
    monitor.close()
    manager.close()
    store.close()


# -- the parent side --------------------------------------------------------------------------


@dataclass
class Trial:
    seed: int
    acked: list[str] = field(default_factory=list)
    rolled: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    killed_after_s: float = 0.0
    recovered: int = 0  # changes settled by recovery, plus 1 if the audit head was repaired


def child_command(*args: object) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), *map(str, args)]


def child_env() -> dict[str, str]:
    # the caller's path after the repository's: a checkout that points it at its own code
    # (a worktree's package links) has its children run that code too
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "PYTHONDONTWRITEBYTECODE": "1"}


def read_lines(stream: Iterable[str], into: list[str]) -> threading.Thread:
    def pump() -> None:
        for line in stream:
            into.append(line.rstrip("\n"))

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    return thread


def kill_at_marker(argv: Sequence[str], marker: str, *, timeout_s: float = 120) -> list[str]:
    """Run ``argv`` until it prints the line ``marker``, SIGKILL it there; what it printed."""
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=child_env())
    lines: list[str] = []
    reader = read_lines(child.stdout or [], lines)
    try:
        deadline = time.monotonic() + timeout_s
        while marker not in lines and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.05)
        assert marker in lines, lines
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        reader.join(timeout=5)
        if child.stdout is not None:
            child.stdout.close()
    assert child.returncode == -signal.SIGKILL
    return lines


def run_crash_trial(work: Path, seed: int, *, count: int = 1000, max_delay_s: float = 0.3) -> Trial:
    """Start a child that applies ``count`` changes, SIGKILL it at a random moment, check."""
    rng = random.Random(seed)
    root, db = work / "root", work / "history.db"
    initial = initial_files(rng)
    for rel, data in initial.items():
        if data is not None:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(data)
    root.mkdir(parents=True, exist_ok=True)
    trial = Trial(seed)
    proc = subprocess.Popen(
        child_command("crash", db, root, seed, count),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    assert proc.stdout is not None
    ready = proc.stdout.readline().strip()
    if ready != "READY":
        proc.kill()
        _, err = proc.communicate()
        trial.failures.append(f"child did not start: {ready!r} {err[-2000:]}")
        return trial
    lines: list[str] = []
    pump = read_lines(proc.stdout, lines)
    trial.killed_after_s = rng.uniform(0.0, max_delay_s)
    time.sleep(trial.killed_after_s)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    pump.join(5)
    assert proc.stderr is not None
    err = proc.stderr.read()
    proc.stderr.close()
    proc.stdout.close()
    if proc.returncode != -signal.SIGKILL:
        trial.failures.append(f"child ended by itself (rc {proc.returncode}): {err[-2000:]}")
    trial.acked = [line.split()[1] for line in lines if line.startswith("ACK ")]
    trial.rolled = [line.split()[1] for line in lines if line.startswith("RBK ")]
    failures, trial.recovered = check_history(db, root, initial, trial.acked, trial.rolled)
    trial.failures.extend(failures)
    return trial


def check_history(
    db: Path | str,
    root: Path,
    initial: dict[str, bytes | None],
    acked: list[str],
    rolled: list[str],
) -> tuple[list[str], int]:
    """Reopen (which recovers) and compare files, history and audit.

    Returns the failures and how many things recovery had to settle.
    """
    failures: list[str] = []
    root = root.resolve()
    with ImprovementManager(db, recover=False) as manager:
        recovered = len(manager.recover())
        history = manager.get_history(limit=1_000_000)
        by_id = {r.change_id: r for r in history}
        live = (ChangeStatus.APPLIED, ChangeStatus.KEPT, ChangeStatus.ROLLED_BACK)
        for cid in acked:
            record = by_id.get(cid)
            if record is None:
                failures.append(f"acknowledged change {cid} is lost")
            elif record.status not in live:
                failures.append(f"acknowledged change {cid} is {record.status.value}")
        for cid in rolled:
            record = by_id.get(cid)
            if record is None or record.status is not ChangeStatus.ROLLED_BACK:
                failures.append(f"acknowledged rollback of {cid} is not ROLLED_BACK")
        failures.extend(
            f"change {r.change_id} is still pending" for r in history
            if r.status is ChangeStatus.PENDING
        )  # fmt: skip
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            where = path.relative_to(root)
            if where.parts[0] == ".agent":
                continue
            if path.name.endswith(".tmp"):
                failures.append(f"temp file left behind: {where}")
            elif not is_whole(path.read_bytes()):
                failures.append(f"{where} is half-written")
        for rel, start in initial.items():
            failures.extend(_replay(root, rel, start, history))
        audit = manager.verify_audit_chain()
        if not audit:
            failures.append(f"audit chain: {audit.problems}")
        recovered += int(audit.repaired)
    return failures, recovered


def _replay(root: Path, rel: str, start: bytes | None, history: list[ChangeRecord]) -> list[str]:
    """The file must equal its start replayed through the live changes, which must link."""
    target = str(root / rel)
    expected = None if start is None else hashlib.sha256(start).hexdigest()
    for record in history:
        if record.status not in (ChangeStatus.APPLIED, ChangeStatus.KEPT):
            continue
        for file in record.files:
            if file.path != target:
                continue
            if file.old_sha256 != expected:
                return [f"{rel}: change {record.change_id} does not follow the one before it"]
            expected = file.new_sha256
    current = root / rel
    actual = hashlib.sha256(current.read_bytes()).hexdigest() if current.exists() else None
    return [] if actual == expected else [f"{rel} differs from a replay of the history"]


if __name__ == "__main__":
    quiet_logs()
    mode, db_arg, root_arg, n_arg, count_arg = sys.argv[1:6]
    if mode == "crash":
        _child_crash(Path(db_arg), Path(root_arg), int(n_arg), int(count_arg))
    elif mode == "concurrent":
        _child_concurrent(Path(db_arg), Path(root_arg), int(n_arg), int(count_arg))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
