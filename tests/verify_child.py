"""A process that applies a change to verify it, killed at a chosen stage, and the checks after.

As a script it is the child. ``cycle`` does what ``ChangePipeline`` does to the store and the
files, through the same public calls: hold a lease, apply a group of agent files under it, run
"evals" (read and hash the changed files, in rounds), reach a verdict, then keep the group
(``mark_kept``) or roll it back (``rollback_unproven``). ``plan`` executes a code-update plan
(``CodeUpdater``) whose test command marks that validation started and then sleeps. Each child
prints a marker, flushed, as it enters a stage, so the parent can kill it at a random moment
inside that stage. Two gaps are instantaneous in the real loop (after the apply and before the
first eval run; between the verdict and its record): there the child waits a hundred
milliseconds (``_GAP_S``) so that a kill can land inside them; that wait is the only
simulated part.

Imported, it gives the parent side: :func:`run_stage_trial` (start, kill with SIGKILL inside a
stage, reopen, check) and :func:`check_settled` (every file holds its bytes from before the
change, or the bytes of a kept change; no change is live without being proven; nothing is
executing or reported active; the audit chain verifies).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from crash_child import child_env, quiet_logs, read_lines  # noqa: E402

from agentmend.infrastructure.changes.improvement_manager import (  # noqa: E402
    ChangeStatus,
    ChangeType,
    ImprovementAction,
    ImprovementManager,
    LeaseLost,
    LeaseTerms,
)

CYCLE_STAGES = ("applied", "evals", "verdict", "rollback")
"""Where a verifying process is killed: after the apply (before the first eval run), during
the eval runs, between the verdict and its record, during the rollback of a rejected change."""
PLAN_STAGES = ("plan_execution", "plan_validation")
"""Where a process executing a code plan is killed: while it gates and applies, while the
project's tests run."""
STAGES = CYCLE_STAGES + PLAN_STAGES

_GAP_S = 0.1
"""How long the child waits in a gap the real loop passes at once (see the module docstring)."""

_MARKERS = {
    "applied": ("APPLIED", _GAP_S),
    "evals": ("EVALS", 0.3),
    "verdict": ("VERDICT", _GAP_S),
    "rollback": ("ROLLBACK", 0.06),
    "plan_execution": ("EXECUTE", 0.8),
    "plan_validation": ("VALIDATING", 0.4),
}
"""Per stage: the marker the child prints on entering it, and how long the stage lasts
(about): the parent kills at a uniformly random moment within that window."""

_NEXT = {
    "applied": ("EVALS",),
    "evals": ("VERDICT",),
    "verdict": ("KEPT", "ROLLBACK"),
    "rollback": ("ROLLED",),
}
"""Per stage of a cycle child: the markers that say it had left the stage."""


def _files(count: int) -> list[str]:
    return [f"agents/agent{i:03d}.md" for i in range(count)]


def _content(tag: str, rng: random.Random) -> bytes:
    return (f"---\nname: {tag}\n---\n" + f"{tag} prompt " * rng.randint(20, 400)).encode()


def _action(agent: str) -> ImprovementAction:
    return ImprovementAction(
        target_agent=agent, action_type=ChangeType.PROMPT_MODIFICATION, confidence_score=0.9
    )


def _say(line: str) -> None:
    print(line, flush=True)


# -- the children ------------------------------------------------------------------------------


def _child_cycle(args: dict[str, object]) -> int:
    rng = random.Random(int(str(args["seed"])))
    root, db = Path(str(args["root"])), Path(str(args["db"]))
    terms = LeaseTerms(ttl_s=float(str(args["ttl"])), renew_every_s=float(str(args["renew"])))
    verdict = str(args["verdict"])
    manager = ImprovementManager(db, lease_terms=terms)
    paths = _files(int(str(args["files"])))
    _say("READY")
    with manager.hold_lease() as keeper:
        entries = [
            (_action(f"agent{i:03d}"), path, _content(f"new {path}", rng))
            for i, path in enumerate(paths)
        ]
        records = manager.apply_group(entries, root=root, lease=keeper.lease_id)
        _say("APPLIED " + " ".join(r.change_id for r in records))
        time.sleep(_GAP_S)  # the gap before the first eval run (simulated)
        _say("EVALS")
        try:
            rounds = int(str(args["rounds"]))
            for _ in range(rounds):  # the eval runs: read what the change wrote, again and again
                keeper.ensure_held()
                for path in paths:
                    hashlib.sha256((root / path).read_bytes()).hexdigest()
                time.sleep(float(str(args["eval_s"])) / rounds)
            keep = verdict == "keep" or (verdict == "random" and rng.random() < 0.5)
            _say(f"VERDICT {'keep' if keep else 'reject'}")
            time.sleep(_GAP_S)  # between the verdict and its record (simulated)
            if keep:
                manager.mark_kept(records[0].change_id, {"passed": True}, lease=keeper.lease_id)
                _say("KEPT")
            else:
                _say("ROLLBACK")
                manager.rollback_unproven(
                    records[0].change_id, reason="verification failed", lease=keeper.lease_id
                )
                _say("ROLLED")
        except LeaseLost as exc:
            _say(f"LOST {exc.lease_id}")
            return 3
    _say("DONE")
    return 0


class _Approve:
    """A supervisor that approves every plan (the gates are not what these trials test)."""

    async def review(self, change: object) -> object:
        from agentmend.infrastructure.changes.proposal import GateVerdict

        return GateVerdict(gate="code-supervisor", passed=True, reason="approved for the trial")


def _child_plan(args: dict[str, object]) -> int:
    from agentmend.infrastructure.code_update.updater import CodeUpdater, FileOperation
    from agentmend.infrastructure.settings import Settings

    rng = random.Random(int(str(args["seed"])))
    root, db = Path(str(args["root"])), Path(str(args["db"]))
    marker = str(args["marker"])
    sleep = f"import os, time; open({marker!r}, 'w').write(str(os.getpid())); time.sleep(0.5)"
    settings = Settings(test_command=(sys.executable, "-c", sleep), test_timeout_s=60)
    manager = ImprovementManager(db)
    updater = CodeUpdater(root, manager=manager, reviewer=_Approve(), settings=settings)  # type: ignore[arg-type]
    files = [
        FileOperation(path=path, operation="modify", content=_content(f"plan {path}", rng).decode())
        for path in _files(int(str(args["files"])))
    ]
    plan = updater.create_plan("rewrite every agent file", files)
    updater.approve(plan.plan_id)
    _say("READY")
    _say(f"EXECUTE {plan.plan_id}")
    result = asyncio.run(updater.execute(plan.plan_id))
    _say(f"RESULT {result.status}")
    _say("DONE")
    return 0


# -- the parent side ----------------------------------------------------------------------------


@dataclass
class StageTrial:
    stage: str
    seed: int
    violations: list[str] = field(default_factory=list)
    in_stage: bool = False  # the kill landed before the child reached its next stage
    interrupted: int = 0  # changes recovery settled as FAILED "interrupted"
    lines: list[str] = field(default_factory=list)


def make_root(work: Path, files: int, rng: random.Random) -> tuple[Path, dict[str, bytes]]:
    root = work / "root"
    initial: dict[str, bytes] = {}
    for path in _files(files):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        initial[path] = _content(f"old {path}", rng)
        (root / path).write_bytes(initial[path])
    return root, initial


def run_stage_trial(
    work: Path, stage: str, seed: int, *, files: int = 40, rounds: int = 10
) -> StageTrial:
    """Start a child, SIGKILL it at a random moment inside ``stage``, reopen and check."""
    rng = random.Random(seed)
    work.mkdir(parents=True, exist_ok=True)
    root, initial = make_root(work, files, rng)
    db, scratch = work / "store.db", work / "scratch"  # the plan child's TMPDIR
    scratch.mkdir(exist_ok=True)
    env = {**child_env(), "TMPDIR": str(scratch)}  # its validation copy is made in there
    args: dict[str, object] = {"db": str(db), "root": str(root), "seed": seed, "files": files}
    if stage in CYCLE_STAGES:
        verdict = "reject" if stage == "rollback" else "random"
        args.update(verdict=verdict, rounds=rounds, eval_s=0.3, ttl=30.0, renew=5.0)
        mode = "cycle"
    else:
        args.update(marker="validating.pid")  # written in the copy, the only writable place
        mode = "plan"
    trial = StageTrial(stage, seed)
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), mode, json.dumps(args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    pump = read_lines(proc.stdout, trial.lines)
    word, window = _MARKERS[stage]
    try:
        entered = _wait_for(trial.lines, proc, word, scratch if word == "VALIDATING" else None)
        if not entered:
            trial.violations.append(f"child never reached {word}: {proc.stderr.read()[-2000:]}")
            return trial
        time.sleep(rng.uniform(0, window))
        before_kill = list(trial.lines)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        _kill_test_command(scratch)
    pump.join(5)
    proc.stdout.close()
    proc.stderr.close()
    if stage in CYCLE_STAGES:
        trial.in_stage = not any(line.startswith(_NEXT[stage]) for line in before_kill)
    elif stage == "plan_execution":
        trial.in_stage = _validation_pid(scratch) is None
    else:
        trial.in_stage = not any(line.startswith("RESULT") for line in before_kill)
    violations, trial.interrupted = check_settled(db, root, initial)
    trial.violations.extend(violations)
    return trial


def _wait_for(
    lines: list[str], proc: subprocess.Popen[str], word: str, scratch: Path | None
) -> bool:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if scratch is not None and _validation_pid(scratch) is not None:
            return True
        if scratch is None and any(line.split()[0] == word for line in lines if line):
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.001)
    return False


def _validation_pid(scratch: Path) -> int | None:
    """The test command's pid, once it has written it in the validation copy under ``scratch``."""
    for marker in scratch.glob("agentmend-validate-*/project/validating.pid"):
        with contextlib.suppress(OSError, ValueError):
            return int(marker.read_text())
    return None


def _kill_test_command(scratch: Path) -> None:
    """The test command runs in a session of its own: end it too (it was ours)."""
    pid = _validation_pid(scratch)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def check_settled(db: Path, root: Path, initial: dict[str, bytes]) -> tuple[list[str], int]:
    """Reopen (recovery runs, plans are settled as every face settles them) and check.

    Every file must hold its bytes from before the change, or the bytes of a KEPT change;
    no change is APPLIED or PENDING; no plan is executing or reported active; the audit chain
    verifies. Returns the violations and how many changes were settled as interrupted.
    """
    from agentmend.infrastructure.changes.protocol.decisions import list_plans
    from agentmend.infrastructure.code_update.plan_recovery import settle_interrupted_plans
    from agentmend.infrastructure.code_update.plans import PLAN_KIND

    violations: list[str] = []
    root = root.resolve()
    with ImprovementManager(db) as manager:
        settle_interrupted_plans(manager)
        history = manager.get_history(limit=1_000_000)
        kept: dict[str, str | None] = {}
        interrupted = sum(
            1
            for record in history
            if record.status is ChangeStatus.FAILED
            and record.rollback_info is not None
            and record.rollback_info.get("reason") == "interrupted"
        )
        for record in history:
            if record.status in (ChangeStatus.APPLIED, ChangeStatus.PENDING):
                violations.append(f"change {record.change_id} is {record.status.value}")
            if record.status is ChangeStatus.KEPT:
                for file in record.files:
                    kept[file.path] = file.new_sha256
        for rel, data in initial.items():
            path = root / rel
            actual = hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None
            expected = kept.get(str(path), hashlib.sha256(data).hexdigest())
            if actual != expected:
                state = "kept" if str(path) in kept else "from before the change"
                violations.append(f"{rel} does not hold its bytes {state}")
        plans = list_plans(manager.store, limit=None, payload={"kind": PLAN_KIND})
        for plan in plans:
            if plan.status == "executing":
                violations.append(f"plan {plan.plan_id} is still executing")
        if plans:
            from agentmend.infrastructure.code_update.updater import CodeUpdater

            updater = CodeUpdater(root, manager=manager, reviewer=_Approve())  # type: ignore[arg-type]
            active = updater.status().active_improvement
            if active is not None:
                violations.append(f"status reports plan {active.plan_id} active")
        audit = manager.verify_audit_chain()
        if not audit:
            violations.append(f"audit chain: {audit.problems}")
    return violations, interrupted


if __name__ == "__main__":
    quiet_logs()
    mode, raw = sys.argv[1:3]
    parsed = json.loads(raw)
    if mode == "cycle":
        raise SystemExit(_child_cycle(parsed))
    if mode == "plan":
        raise SystemExit(_child_plan(parsed))
    raise SystemExit(f"unknown mode {mode!r}")


@dataclass
class StoppedOwnerTrial:
    violations: list[str]
    settled_while_stopped: int  # changes recovery settled while the owner was stopped
    interrupted: int  # changes FAILED "interrupted" in the end (the owner overwrote none)
    owner_lines: list[str]
    owner_exit: int | None


def run_stopped_owner_trial(
    work: Path, seed: int, *, files: int = 8, ttl_s: float = 1.0
) -> StoppedOwnerTrial:
    """Stop a verifying owner (SIGSTOP) past its lease's expiry, reopen, resume it (SIGCONT).

    The reopen must settle the owner's change (its lease expired while it could not renew);
    the resumed owner must find its lease lost and stop without writing.
    """
    rng = random.Random(seed)
    work.mkdir(parents=True, exist_ok=True)
    root, initial = make_root(work, files, rng)
    db = work / "store.db"
    args = {"db": str(db), "root": str(root), "seed": seed, "files": files, "verdict": "keep",
            "rounds": 40, "eval_s": 2.0, "ttl": ttl_s, "renew": ttl_s / 5}  # fmt: skip
    lines: list[str] = []
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "cycle", json.dumps(args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=child_env(),
    )
    assert proc.stdout is not None
    pump = read_lines(proc.stdout, lines)
    settled = 0
    try:
        if not _wait_for(lines, proc, "EVALS", None):
            return StoppedOwnerTrial(["owner never reached EVALS"], 0, 0, lines, proc.poll())
        proc.send_signal(signal.SIGSTOP)
        time.sleep(ttl_s * 1.5)  # the lease expires while its owner cannot renew it
        with ImprovementManager(db, recover=False) as manager:
            settled = len(manager.recover())
        proc.send_signal(signal.SIGCONT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            proc.wait()
    pump.join(5)
    proc.stdout.close()
    violations, interrupted = check_settled(db, root, initial)
    return StoppedOwnerTrial(violations, settled, interrupted, lines, proc.returncode)
