"""Crash trials at scale: 100 writers killed with SIGKILL at a random moment, each checked.

Each trial runs ``tests/crash_child.py`` (single-file applies, groups and rollbacks, up to 1,000
changes), kills it after a random delay, reopens the store (recovery runs) and checks that no
acknowledged change is lost, no file is half-written or left over, the files equal a replay of
the history and the audit chain verifies. Prints the number of trials and every failure.

    python benchmarks/bench_crash.py [--trials 100] [--max-delay 1.0]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from crash_child import quiet_logs, run_crash_trial


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--max-delay", type=float, default=1.0, help="latest kill, seconds")
    args = parser.parse_args()
    quiet_logs()
    failures: list[str] = []
    acked: list[int] = []
    recovered = 0
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.trials):
            trial = run_crash_trial(Path(tmp) / f"t{seed}", 1000 + seed, max_delay_s=args.max_delay)
            failures.extend(f"seed {trial.seed}: {f}" for f in trial.failures)
            acked.append(len(trial.acked))
            recovered += trial.recovered > 0
    elapsed = time.perf_counter() - started
    print(f"crash trials: {args.trials}, failures: {len(failures)}, {elapsed:.1f} s")
    print(
        f"acknowledged changes per trial: median {statistics.median(acked):.0f}, "
        f"max {max(acked)}; trials where recovery had work: {recovered}"
    )
    for failure in failures:
        print(f"  FAIL {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
