"""agentmend's interactive session: ask the team questions, watch it degrade, heal and prove it.

    agentmend session                      the simulated six-agent team, offline (no key)
    agentmend session --provider anthropic --agents .claude/agents
    python main.py --demo                  a scripted scenario, non-interactive, exits 0

``python main.py``, ``python -m agentmend`` and ``agentmend session`` all start it. When the team
has published releases the session is one of its workers: it serves them, the canary for its
share (``agentmend.faces.release_serving``), and publishes what its cycles keep as the next release.

Commands are read one line at a time from standard input, so the session can be scripted with a
pipe. Ctrl-C stops what is running (a question, ``/traffic`` with how many questions ran, a
cycle with whatever it had applied rolled back) and returns to the prompt; Ctrl-C at the prompt
ends the session. The end of input (the end of a script, Ctrl-D) answers no to a pending
question, stops generated traffic after the question running, and ends the session with exit
code 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console
from rich.text import Text

from agentmend.faces.release_serving import (
    ReleaseChanges,
    ServedReleases,
    release_status_line,
    serve_releases,
)
from agentmend.faces.session.checker import answer_checker, checker_status, left_to_checker
from agentmend.faces.session.input import LineReader, add_arguments, parse_args, settings_overrides
from agentmend.faces.session.lock import SessionLock
from agentmend.faces.session.views import (
    backlog_line,
    cycle_event_line,
    cycle_summary_line,
    diff_text,
    history_table,
    issue_line,
    one_line_error,
    status_table,
    task_table,
)
from agentmend.faces.terminal import safe_console, terminal_text
from agentmend.faces.workspace import Workspace
from agentmend.infrastructure.changes.audit.log import ChainVerification
from agentmend.infrastructure.changes.gates import HumanApprovalGate
from agentmend.infrastructure.changes.proposal import ProposedChange
from agentmend.infrastructure.errors import AgentmendError, ConfigurationError, StoreError
from agentmend.infrastructure.models import ChangeStatus, IssueReport
from agentmend.infrastructure.principal import Principal
from agentmend.infrastructure.redaction import redact
from agentmend.infrastructure.settings import Settings, load_settings, workspace_settings
from agentmend.infrastructure.simulation import FaultKind, SimulatedRuntime
from agentmend.infrastructure.structured_logger import configure_logging, get_logger
from agentmend.loop.cycle import CycleEvent, CycleResult
from agentmend.loop.meta_orchestrator import MetaOrchestrator
from agentmend.roles.team import UnknownAgent

T = TypeVar("T")

__all__ = ["LineReader", "Session", "add_arguments", "main", "parse_args", "run"]

log = get_logger(__name__)

HELP = """\
Type a question to run it through the team. Commands:
  /status                 per agent: runs, success rate, p95 latency, detector, recent runs
  /inject AGENT FAULT     simulation only; FAULT is one of: {faults}
  /heal [AGENT]           simulation only: clear injected faults
  /traffic [N]            simulation only: run N generated questions (default 20)
  /improve [AGENT]        run an improvement cycle (for AGENT, or the most urgent issue)
  /history                changes made to the agents
  /audit                  the audit trail, and whether its hash chain verifies
  /rollback [ID] [force|cascade]   undo a change (default: the latest applied or kept)
  /approve on|off         start a cycle on a detected issue without asking
  /issue [approve|decline ID]   the fleet checker's questions (watch --on-issue ask); answer one
  /yolo on|off            skip the human approval of each change (the audit says so)
  /help, /quit"""

_KEY_PROVIDERS = {"anthropic", "claude-agent-sdk"}
_YES_NO = {"y", "yes", "n", "no"}
_CYCLE_STOPPED = "the cycle was aborted; anything it applied is rolled back."


@dataclass
class _Traffic:
    """What ``/traffic`` has run so far, for its summary whether it finished or was stopped."""

    asked: int
    ran: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    notice: str | None = None  # the last question's, if it went without the store

    def summary(self) -> str:
        failed = ", ".join(f"{name} {k}" for name, k in sorted(self.failures.items())) or "none"
        ran = f"{self.ran}" if self.ran == self.asked else f"{self.ran} of {self.asked}"
        return f"ran {ran} question(s) through the team; failed runs: {failed}"


class Session:
    """The interactive loop: reads commands, runs the team and the cycle, shows each step."""

    def __init__(
        self,
        workspace: Workspace,
        console: Console,
        reader: LineReader,
        *,
        seed: int,
        served: ServedReleases | None = None,
        routing_key: str | None = None,
    ) -> None:
        self.workspace = workspace
        self.served = served
        self._release_changes = ReleaseChanges(served.follower) if served is not None else None
        self.routing_key = routing_key
        self.console = console
        self.reader = reader
        self.interactive = sys.stdin.isatty()
        # the person at the keyboard invokes the changes, with the rights settings give
        user = getpass.getuser()
        principal = Principal(
            user_id=user,
            name=f"{user} (interactive session)",
            permissions=workspace.settings.default_principal.permissions,
        )
        self.orchestrator: MetaOrchestrator = workspace.orchestrator(
            seed=seed,
            principal=principal,
            confirm_cycle=self._confirm_cycle,
            approval_callback=self._approve_change,
            on_progress=self._show_event,
            releases=served.follower if served is not None else None,
            publisher=served.publisher() if served is not None else None,
        )
        self._work: asyncio.Task[Any] | None = None
        self._interrupted = False

    # -- prompts -----------------------------------------------------------------------------

    async def _ask_yes_no(self, question: str) -> bool:
        self.console.print(Text(f"{question} (y/n) ", style="bold"), end="")
        answer = await self.reader.read()
        if answer is None:
            self.console.print(Text("\nend of input: counted as no", style="yellow"))
            return False
        if not self.interactive:
            self.console.print(answer)
        return answer.strip().lower() in ("y", "yes")

    async def _ask_in_time(self, question: str) -> bool:
        try:
            return await self._ask_yes_no(question)
        except asyncio.CancelledError:
            if self._interrupted:
                raise  # Ctrl-C, not the prompt's own time limit
            self.console.print(Text("\nno answer in time: counted as no", style="yellow"))
            raise

    async def _confirm_cycle(self, issue: IssueReport) -> bool:
        line = issue_line(issue)
        if self._simulated():
            line.append(" (times are the simulation's)", style="dim")
        self.console.print(line)
        timeout = self.orchestrator.settings.auto_decision_timeout
        return await self._ask_in_time(
            f"Run self-improvement cycle? (no answer in {timeout:g}s means no)"
        )

    async def _approve_change(self, change: ProposedChange) -> bool:
        self.console.print(diff_text(change.diff))
        return await self._ask_in_time(f"Apply this change to {change.action.target_agent}?")

    def _show_event(self, event: CycleEvent) -> None:
        self.console.print(cycle_event_line(event))

    # -- work that Ctrl-C can abort ----------------------------------------------------------

    async def _abortable(
        self, work: Coroutine[Any, Any, T], *, stopped: Callable[[], str] = lambda: _CYCLE_STOPPED
    ) -> T | None:
        """Run ``work`` so that Ctrl-C stops it; then say what stopped (``stopped()``) and None."""
        task: asyncio.Task[T] = asyncio.ensure_future(work)
        self._work = task
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # the session itself is being cancelled
            self.console.print(Text(f"Interrupted: {stopped()}"))
            return None
        finally:
            self._work = None
            self._interrupted = False

    def interrupt(self) -> bool:
        """Stop the running work; False when nothing runs (then Ctrl-C ends the session).

        A second Ctrl-C while the first is still being carried out is not passed on: what a
        cycle applied is being rolled back, and cancelling that would leave it to recovery.
        """
        if self._work is None or self._work.done():
            return False
        if self._interrupted:
            self.console.print(Text("\nstill stopping (undoing what was applied) ...", "yellow"))
            return True
        self._interrupted = True
        self._work.cancel()
        return True

    # -- commands ----------------------------------------------------------------------------

    async def run(self) -> int:
        settings = self.workspace.settings
        self.console.print(
            Text(
                f"agentmend: {_count(len(self.orchestrator.team.names), 'agent')} from "
                f"{self.workspace.team_dir}, provider {settings.provider}, workspace "
                f"{self.workspace.path}; detection starts after a baseline of "
                f"{settings.baseline_n} runs per agent. Type /help for commands.",
                style="bold",
            )
        )
        self._print_releases()
        self._print_kept_faults()
        while True:
            if self.interactive:
                self.console.print("agentmend> ", end="")
            line = await self.reader.read()
            if line is None:
                return 0
            line = line.strip()
            if not line:
                continue
            if not self.interactive:
                self.console.print(Text(f"agentmend> {line}", style="dim"))
            if line in ("/quit", "/exit"):
                return 0
            if line.lower() in _YES_NO:
                # an answer that came after its prompt timed out (which counted as no) must
                # not go to the team as a question
                self.console.print(
                    "no question is waiting for a yes/no answer (no answer in time counts as no)"
                )
                continue
            self._announce_release_changes()
            try:
                await self.dispatch(line)
            except Exception as exc:  # the session outlives whatever a command meets
                error = Text(f"error: {one_line_error(exc)}", style="red")
                self.console.print(error, soft_wrap=True)  # one line, whatever its length
                log.info("command_failed", command=line, exc_info=True)  # --verbose shows it
            self._announce_release_changes()

    async def dispatch(self, line: str) -> None:
        if not line.startswith("/"):
            await self.ask(line)
            return
        command, *args = line.split()
        handler: Callable[[list[str]], Awaitable[None]] | None = {
            "/status": self.status,
            "/inject": self.inject,
            "/heal": self.heal,
            "/traffic": self.traffic,
            "/improve": self.improve,
            "/history": self.history,
            "/audit": self.audit,
            "/rollback": self.rollback,
            "/approve": self.approve,
            "/issue": self.issue,
            "/yolo": self.yolo,
            "/help": self.help,
        }.get(command)
        if handler is None:
            self.console.print(Text(f"unknown command {command!r}; /help lists them", "red"))
            return
        await handler(args)

    async def ask(self, question: str) -> None:
        task = await self._abortable(
            self.orchestrator.execute_task(question, routing_key=self.routing_key),
            stopped=lambda: (
                "the question was stopped; a cycle it started is aborted and "
                "anything it applied rolled back."
            ),
        )
        if task is None:
            return
        self.console.print(task_table(task, simulated=self._simulated()))
        self._print_store_notice(task.store_notice)
        for cycle in task.cycles:
            self.console.print(cycle_summary_line(cycle))
        for issue in task.declined:
            self.console.print(Text(f"cycle declined for {issue.agent_name}", style="yellow"))
        for line in left_to_checker(task):
            self.console.print(line, soft_wrap=True)

    def _print_store_notice(self, notice: str | None) -> None:
        """The steps a question skipped because the store was out of reach, on one line."""
        if notice is not None:
            self.console.print(Text(notice, style="yellow"), soft_wrap=True)

    def _print_kept_faults(self) -> None:
        """The faults an earlier /inject left in this workspace (they last until /heal)."""
        runtime = self.orchestrator.team.runtime
        if not isinstance(runtime, SimulatedRuntime):
            return
        kept = [
            f"{agent} {fault.kind.value}"
            for agent in self.orchestrator.team.names
            for fault in runtime.faults(agent)
        ]
        if kept:
            self.console.print(
                Text(f"injected faults still active: {', '.join(kept)} (/heal ends them)", "yellow")
            )

    def _announce_release_changes(self) -> None:
        """A canary promoted or rolled back, a new stable: said once, around each command."""
        if self._release_changes is not None:
            for line in self._release_changes.since_last_look():
                self.console.print(Text(f"releases: {line}", style="bold yellow"), soft_wrap=True)

    def _print_releases(self) -> None:
        if self.served is not None:
            status = self.served.follower.status()
            self.console.print(
                Text(release_status_line(status), style="yellow" if not status.connected else ""),
                soft_wrap=True,
            )

    async def status(self, _: list[str]) -> None:
        self._print_releases()  # first: it holds even when the store is out of reach
        orchestrator = self.orchestrator
        metrics = orchestrator.monitor.get_metrics()
        stats = {name: orchestrator.detector.statistics(name) for name in metrics}
        self.console.print(
            status_table(
                metrics,
                stats,
                baseline_n=orchestrator.monitor.baseline_n,
                simulated=self._simulated(),
            )
        )
        if not metrics:
            self.console.print("no executions yet: ask the team a question")
        line = backlog_line(*orchestrator.monitor.write_backlog())
        if line is not None:
            self.console.print(line)
        refused = orchestrator.monitor.backlog_status().refused
        if refused:
            self.console.print(
                Text(
                    f"{refused} runs refused because the record backlog was full "
                    "(record() outran the store; see AGENTMEND_MAX_RECORD_BACKLOG)",
                    style="yellow",
                )
            )
        for stem, error in orchestrator.team.broken.items():
            self.console.print(Text(f"{stem}: definition broken: {error}", style="red"))
        try:
            self._print_checker()
            check = orchestrator.manager.verify_audit_chain(repair=False)
        except StoreError as exc:  # the runs and the release above hold without the store
            self.console.print(
                Text(f"audit chain not checked: store unreachable: {exc}", style="yellow"),
                soft_wrap=True,
            )
            return
        if not check:
            self._print_chain_problems(check)

    def _print_checker(self) -> None:
        for line in checker_status(self.orchestrator):
            self.console.print(line, soft_wrap=True)

    async def issue(self, args: list[str]) -> None:
        for line in answer_checker(self.orchestrator, args):
            self.console.print(line, soft_wrap=True)

    def _print_chain_problems(self, check: ChainVerification) -> None:
        self.console.print(Text("audit chain does NOT verify:", "bold red"))
        for p in check.problems:
            where = f"row {p.row_id}: " if p.row_id is not None else ""
            self.console.print(Text(f"  {where}{p.kind}: {p.detail}", "red"))

    def _simulated(self) -> bool:
        return isinstance(self.orchestrator.team.runtime, SimulatedRuntime)

    def _simulation(self) -> SimulatedRuntime | None:
        runtime = self.orchestrator.team.runtime
        if isinstance(runtime, SimulatedRuntime):
            return runtime
        self.console.print(Text("/inject and /heal work on the simulated team only", "red"))
        return None

    async def inject(self, args: list[str]) -> None:
        runtime = self._simulation()
        if runtime is None:
            return
        faults = ", ".join(kind.value for kind in FaultKind)
        if len(args) != 2:
            self.console.print(Text(f"usage: /inject AGENT FAULT (FAULT: {faults})", "red"))
            return
        agent, fault = args
        self.orchestrator.team.spec(agent)  # UnknownAgent names the agents there are
        try:
            kind = FaultKind(fault)
        except ValueError:
            self.console.print(Text(f"unknown fault {fault!r}; one of: {faults}", "red"))
            return
        runtime.inject(agent, kind)
        self.console.print(f"injected {kind.value} into {agent}")

    async def heal(self, args: list[str]) -> None:
        runtime = self._simulation()
        if runtime is None:
            return
        agent = args[0] if args else None
        if agent is not None:
            self.orchestrator.team.spec(agent)
        runtime.heal(agent)
        self.console.print(f"healed {agent or 'every agent'}")

    async def traffic(self, args: list[str]) -> None:
        if self._simulation() is None:
            return
        try:
            count = int(args[0]) if args else 20
        except ValueError:
            count = 0
        if not 1 <= count <= 1000 or len(args) > 1:
            self.console.print(Text("usage: /traffic [N], N from 1 to 1000", "red"))
            return
        tally = _Traffic(asked=count)
        finished = await self._abortable(
            self._run_traffic(tally), stopped=lambda: f"stopped the traffic: {tally.summary()}"
        )
        if finished is not None:
            self.console.print(tally.summary())
            self._print_store_notice(tally.notice)

    async def _run_traffic(self, tally: _Traffic) -> _Traffic:
        """Ask the generated questions, one at a time, counting into ``tally`` as they end."""
        for n in range(tally.asked):
            if self.reader.ended:  # a script that ended stops its traffic, not waits on it
                self.console.print(f"input ended: stopped after {n} of {tally.asked} question(s)")
                tally.asked = n
                break
            task = await self.orchestrator.execute_task(f"Simulated learner question {n + 1}")
            tally.ran += 1
            for name in task.failed:
                tally.failures[name] = tally.failures.get(name, 0) + 1
            tally.notice = task.store_notice
            for cycle in task.cycles:
                self.console.print(cycle_summary_line(cycle))
        return tally

    async def improve(self, args: list[str]) -> None:
        orchestrator = self.orchestrator
        issue = None
        if args:
            orchestrator.team.spec(args[0])  # UnknownAgent names the agents there are
        else:
            issue = orchestrator.next_issue()
            if issue is None:
                self.console.print("no open issue; name an agent: /improve AGENT")
                return

        async def diagnose_and_fix(issue: IssueReport | None) -> CycleResult:
            # reproducing on the eval suite can take minutes on a real provider: Ctrl-C
            # aborts it like the cycle itself
            if issue is None:
                issue = await orchestrator.issue_for(
                    args[0], requested_by="the interactive session"
                )
            return await orchestrator.run_improvement_cycle(issue)

        result = await self._abortable(diagnose_and_fix(issue))
        if result is not None:
            self.console.print(cycle_summary_line(result))

    async def history(self, _: list[str]) -> None:
        records = self.orchestrator.manager.get_history(limit=30)
        if not records:
            self.console.print("no changes yet")
            return
        self.console.print(history_table(records))

    async def audit(self, _: list[str]) -> None:
        audit = self.orchestrator.manager.audit
        for entry in audit.entries(limit=30):
            self.console.print(
                f"{entry.timestamp:%Y-%m-%d %H:%M:%S} {entry.agent_name} {entry.edit_type} "
                f"by {entry.user_name or entry.user_id}: "
                f"{str(entry.old_value)[:40]!r} -> {str(entry.new_value)[:40]!r}"
            )
        check = self.orchestrator.manager.verify_audit_chain()
        for note in check.notes:
            self.console.print(f"note: {note}")
        if check:
            self.console.print(Text("audit chain verified", style="green"))
        else:
            self._print_chain_problems(check)

    async def rollback(self, args: list[str]) -> None:
        flags = {a for a in args if a in ("force", "cascade")}
        ids = [a for a in args if a not in flags]
        if len(ids) > 1:
            self.console.print(Text("usage: /rollback [ID] [force|cascade]", "red"))
            return
        if ids:
            current = self.orchestrator.manager.get_change(ids[0])
            if current is None:
                self.console.print(Text(f"unknown change id {ids[0]!r} (see /history)", "red"))
                return
            if current.status in (ChangeStatus.ROLLED_BACK, ChangeStatus.FAILED):
                state = "rolled back" if current.status is ChangeStatus.ROLLED_BACK else "failed"
                self.console.print(f"change {ids[0]} is already {state}: nothing to roll back")
                return
        record = self.orchestrator.rollback(
            ids[0] if ids else None,
            reason="rolled back from the interactive session",
            force="force" in flags,
            cascade="cascade" in flags,
        )
        if record is None:
            self.console.print("nothing to roll back")
        elif record.status is ChangeStatus.ROLLED_BACK:
            self.console.print(
                Text(f"rolled back {record.change_id}: files restored byte for byte", "green")
            )

    async def approve(self, args: list[str]) -> None:
        on = _on_off(args, "/approve", self.console)
        if on is not None:
            self.orchestrator.auto_improve = on
            self.console.print(f"detected issues {'start a cycle' if on else 'ask first'}")

    async def yolo(self, args: list[str]) -> None:
        on = _on_off(args, "/yolo", self.console)
        if on is None:
            return
        for gate in self.orchestrator.gates:
            if isinstance(gate, HumanApprovalGate):
                gate.yolo_mode = on
        state = "skipped (recorded as yolo_mode)" if on else "asked"
        self.console.print(f"human approval of each change: {state}")

    async def help(self, _: list[str]) -> None:
        self.console.print(HELP.format(faults=", ".join(k.value for k in FaultKind)))


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _on_off(args: list[str], command: str, console: Console) -> bool | None:
    if args in (["on"], ["off"]):
        return args[0] == "on"
    console.print(Text(f"usage: {command} on|off", "red"))
    return None


def _check_provider(settings: Settings) -> None:
    replaying = settings.replay is not None  # a replay needs no key
    if (
        not replaying
        and settings.provider in _KEY_PROVIDERS
        and not os.environ.get("ANTHROPIC_API_KEY")
    ):
        raise ConfigurationError(
            f"--provider {settings.provider} needs ANTHROPIC_API_KEY in the environment "
            "(or run offline: --provider offline)"
        )


OFFLINE_OWN_AGENTS = (
    "--agents runs your own agents, which needs a model provider: --provider anthropic (with "
    "ANTHROPIC_API_KEY), --provider claude-agent-sdk, or --replay CASSETTE (answers recorded "
    "once with --record). The offline provider runs only the simulated team (leave out --agents)."
)
"""Offline, there is nothing that could run a user's agents for real, and the simulated team's
rules (its required headings, its injected faults) would misjudge them, so it is refused."""

SIMULATED_BASELINE_N = 30
"""The simulated team's detection baseline, unless AGENTMEND_BASELINE_N or the store says
otherwise: 500 runs per agent (the production default) would take an afternoon of typing."""


async def _session(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    simulated = settings.provider == "offline" and settings.replay is None
    if simulated and settings.record is None and args.agents is not None:
        raise ConfigurationError(OFFLINE_OWN_AGENTS)
    with (
        Workspace.open(
            args.workspace,
            settings=settings,
            team_dir=args.agents,
            interactive=True,
            # the simulated team's own default, unless the store keeps the team's baseline
            baseline_default=(
                SIMULATED_BASELINE_N if simulated and settings.record is None else None
            ),
        ) as workspace,
        SessionLock(workspace.path) as lock,
    ):
        if lock.held_by is not None:
            console.print(
                Text(
                    f"note: another agentmend session ({lock.held_by}) is open on "
                    f"{workspace.path}; both share its store and team, and a change either "
                    "makes is seen by the other only after it reloads",
                    style="yellow",
                )
            )
        served = serve_releases(
            workspace, face="session", mode=settings.follow_releases, pin=settings.serve_release
        )
        try:
            session = Session(
                workspace,
                console,
                LineReader(asyncio.get_running_loop()),
                seed=args.seed,
                served=served,
                routing_key=getattr(args, "routing_key", None),
            )
        except BaseException:
            if served is not None:
                served.close()
            raise
        loop = asyncio.get_running_loop()
        main_task = asyncio.current_task()

        def on_sigint() -> None:
            if not session.interrupt() and main_task is not None:
                main_task.cancel()

        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(signal.SIGINT, on_sigint)
        try:
            return await session.run()
        except asyncio.CancelledError:
            console.print("\nbye")
            return 130
        finally:
            if served is not None:
                served.close()  # before the store it polls is closed
            await workspace.aclose()


def main(argv: list[str] | None = None) -> int:
    """``python main.py``: parse the session's flags and run it."""
    return run(parse_args(argv, description=__doc__.splitlines()[0]))


def run(args: argparse.Namespace) -> int:
    """Run the session (or, with ``--demo``, the demo) for parsed flags; the exit code."""
    configure_logging(logging.INFO if args.verbose else logging.WARNING, stream=sys.stderr)
    # no markup: text such as "/rollback [ID]" or an agent's answer is shown as it is
    # and escaped: an agent's name or answer is shown, never obeyed by the terminal
    console = safe_console(
        highlight=False, markup=False, width=None if sys.stdout.isatty() else 120
    )
    try:
        folder = args.workspace or Path(os.environ.get("AGENTMEND_WORKSPACE") or ".agentmend")
        settings = load_settings(**{**workspace_settings(folder), **settings_overrides(args)})
        _check_provider(settings)
        if args.demo:
            from agentmend.faces.session.demo import run_demo

            return asyncio.run(
                run_demo(
                    console, workspace=args.workspace, seed=args.seed, store_url=settings.store_url
                )
            )
        return asyncio.run(_session(args, settings, console))
    except (AgentmendError, UnknownAgent) as exc:
        print(f"agentmend: {terminal_text(redact(str(exc)))}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
