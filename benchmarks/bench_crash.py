"""Crash trials at scale: writers and verifiers killed with SIGKILL, and recovery's cost at open.

Three parts, each printed as a table:

1. Writers (``tests/crash_child.py``): single-file applies, groups and rollbacks, up to 1,000
   changes, killed after a random delay; checks that no acknowledged change is lost, no file is
   half-written or left over, the files equal a replay of the history, the audit chain
   verifies.
2. The stage matrix (``tests/verify_child.py``): a process verifying a change killed at a random
   moment inside each stage (after the apply, during the eval runs, between the verdict and its
   record, during the rollback, while a code plan is executed, while its tests run), then the
   store reopened as every face opens it. A violation is a file holding neither its bytes from
   before the change nor those of a kept change, a change left applied, pending or executing, a
   plan reported active, or an audit chain that does not verify. Goal: 0 in every cell.
3. Recovery at open: the time to open a manager (recovery included) and of ``recover()`` alone
   on stores holding 0, 10 and 1,000 settled changes (leased changes kept, rolled back, or
   settled by recovery after their owner was gone), with the ratio to the empty store.

    python benchmarks/bench_crash.py [--trials 100] [--matrix-trials 100] [--max-delay 1.0]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from crash_child import quiet_logs, run_crash_trial
from verify_child import STAGES, run_stage_trial

from agentmend.infrastructure.changes.improvement_manager import (
    ChangeType,
    ImprovementAction,
    ImprovementManager,
)


def writers(trials: int, max_delay: float) -> list[str]:
    failures: list[str] = []
    acked: list[int] = []
    recovered = 0
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(trials):
            trial = run_crash_trial(Path(tmp) / f"t{seed}", 1000 + seed, max_delay_s=max_delay)
            failures.extend(f"seed {trial.seed}: {f}" for f in trial.failures)
            acked.append(len(trial.acked))
            recovered += trial.recovered > 0
    elapsed = time.perf_counter() - started
    print(f"writer crash trials: {trials}, failures: {len(failures)}, {elapsed:.1f} s")
    if acked:
        print(
            f"acknowledged changes per trial: median {statistics.median(acked):.0f}, "
            f"max {max(acked)}; trials where recovery had work: {recovered}"
        )
    return failures


def matrix(trials: int) -> list[str]:
    failures: list[str] = []
    print(f"\nstage x {trials} trials: SIGKILL at a random moment inside the stage, then reopen")
    header = f"{'stage':<16} {'trials':>6} {'in stage':>8} {'settled':>8} {'violations':>10}"
    print(header)
    print("-" * len(header))
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for stage in STAGES:
            inside = settled = violations = 0
            for n in range(trials):
                trial = run_stage_trial(Path(tmp) / f"{stage}-{n}", stage, seed=5000 + n)
                inside += trial.in_stage
                settled += trial.interrupted > 0
                violations += bool(trial.violations)
                failures.extend(f"{stage} seed {trial.seed}: {v}" for v in trial.violations)
            print(f"{stage:<16} {trials:>6} {inside:>8} {settled:>8} {violations:>10}")
    print(
        f"({time.perf_counter() - started:.0f} s; 'in stage': the kill landed before the child "
        "left the stage; 'settled': recovery restored the change and marked it failed "
        "'interrupted'; 'violations': trials with any violation)"
    )
    return failures


def _settled_store(db: Path, root: Path, count: int) -> None:
    """``count`` leased changes, a third each kept, rolled back, and settled by recovery."""
    action = ImprovementAction(
        target_agent="agent", action_type=ChangeType.PROMPT_MODIFICATION, confidence_score=0.9
    )
    root.mkdir(parents=True, exist_ok=True)
    with ImprovementManager(db) as manager:
        for i in range(count):
            path = f"agent{i % 50}.md"
            with manager.hold_lease() as keeper:
                record = manager.apply(action, path=path, new_content=f"v{i}\n", root=root,
                                       lease=keeper.lease_id)  # fmt: skip
                if i % 3 == 0:
                    manager.mark_kept(record.change_id, lease=keeper.lease_id)
                elif i % 3 == 1:
                    manager.rollback_unproven(
                        record.change_id, reason="bench", lease=keeper.lease_id
                    )
                else:  # its owner "dies": a pid that runs nothing
                    with manager.store.transaction() as conn:
                        conn.execute(
                            "UPDATE leases SET pid = ? WHERE lease_id = ?",
                            (2**22 + 7, keeper.lease_id),
                        )
            if i % 3 == 2:
                manager.recover()


def _median_ms(action: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def recovery_at_open(repeats: int = 30) -> None:
    print(f"\nrecovery at open (median of {repeats})")
    header = f"{'settled changes':>15} {'open ms':>8} {'recover() ms':>13} {'ratio to 0':>10}"
    print(header)
    print("-" * len(header))
    base: float | None = None
    with tempfile.TemporaryDirectory() as tmp:
        for count in (0, 10, 1000):
            db, root = Path(tmp) / f"s{count}.db", Path(tmp) / f"root{count}"
            _settled_store(db, root, count)

            def open_close(db: Path = db) -> None:
                ImprovementManager(db).close()

            open_close()  # warm: the first open of a process pays for imports and caches
            manager = ImprovementManager(db)
            recover_ms = _median_ms(manager.recover, repeats)
            manager.close()
            open_ms = _median_ms(open_close, repeats)
            base = open_ms if base is None else base
            print(f"{count:>15} {open_ms:>8.2f} {recover_ms:>13.3f} {open_ms / base:>10.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--trials", type=int, default=100, help="writer crash trials")
    parser.add_argument("--matrix-trials", type=int, default=100, help="trials per stage")
    parser.add_argument("--max-delay", type=float, default=1.0, help="latest writer kill, s")
    args = parser.parse_args()
    quiet_logs()
    failures = writers(args.trials, args.max_delay) if args.trials else []
    if args.matrix_trials:
        failures += matrix(args.matrix_trials)
    recovery_at_open()
    for failure in failures:
        print(f"  FAIL {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
