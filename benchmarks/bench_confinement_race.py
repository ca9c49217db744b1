"""The symlink race at length: swaps against apply, rollback, recovery and plan execution.

Runs ``tests/race_tree.py`` for ``--seconds`` and prints the seconds, the operations (completed
and refused by name, per kind), the swaps made, anything raised that is not a named error, and
the files outside the roots that changed (0 is the only acceptable figure).

    python benchmarks/bench_confinement_race.py [--seconds 30]
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import structlog
from race_tree import run_race


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    with tempfile.TemporaryDirectory() as tmp:
        result = run_race(Path(tmp), args.seconds)
    print(f"seconds                        {result.seconds:.1f}")
    print(f"swaps to symlinks              {result.swaps}")
    print(f"operations                     {result.operations}")
    print(f"  completed                    {sum(result.completed.values())}")
    for name, count in sorted(result.completed.items()):
        print(f"    {name:<26} {count}")
    print(f"  refused with a named error   {sum(result.refused.values())}")
    for name, count in sorted(result.refused.items()):
        print(f"    {name:<26} {count}")
    print(f"other exceptions               {len(result.unexpected)}")
    for line in result.unexpected[:10]:
        print(f"    {line}")
    print(f"files changed outside the root {len(result.outside_changed)}")
    for rel in result.outside_changed:
        print(f"    {rel}")
    return 1 if result.outside_changed or result.unexpected else 0


if __name__ == "__main__":
    sys.exit(main())
