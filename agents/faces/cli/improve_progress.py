"""What ``agentmend improve`` shows while its cycle runs: each step, and the eval runs done.

A cycle's steps (questions asked, the analysis, each gate, the verdict) are printed whole as
they happen. The eval runs that prove the change (a suite is cases times repeats, before the
change and again after it) take most of a cycle's time, so they are counted as each finishes:
on a terminal in a live line beneath the steps ("eval runs after the change (research-agent):
7 of 12"), which also counts the questions and verifications; in a pipe or a log, where a live
line would be control codes, as plain lines at each quarter of a phase and at its end.
"""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING

from agentmend.faces.session.views import cycle_event_line

if TYPE_CHECKING:
    from rich.console import Console
    from rich.live import Live
    from rich.spinner import Spinner

    from agentmend.loop.cycle import CycleEvent
    from agentmend.loop.cycle_verification import EvalProgress

__all__ = ["ImproveProgress", "eval_line"]

_PHASES = {
    "reproduce": "on the agent as it is",
    "before": "before the change",
    "after": "after the change",
}


def eval_line(progress: EvalProgress) -> str:
    """``eval runs before the change (a, b): 7 of 12``."""
    agents = f" ({', '.join(progress.agents)})" if progress.agents else ""
    return f"eval runs {_PHASES[progress.phase]}{agents}: {progress.done} of {progress.total}"


def _at_a_quarter(progress: EvalProgress) -> bool:
    """Whether this run ends a quarter of its phase (or the phase): when a plain line is due."""
    done, total = progress.done, max(1, progress.total)
    return done >= total or done * 4 // total != (done - 1) * 4 // total


class ImproveProgress:
    """The steps and eval runs of one cycle, shown on ``out`` as they happen.

    Use as a context manager around the cycle; pass :meth:`on_event` as the orchestrator's
    ``on_progress`` and :meth:`on_eval_run` as its verifier's ``on_eval_run``.

    Args:
        out: where to show them.
        live: a terminal: keep a live status line; else print plain lines only.
    """

    def __init__(self, out: Console, *, live: bool) -> None:
        self.out = out
        self.live = live
        self.questions = 0
        self.verifications = 0
        self.step = "starting the cycle"
        self.eval: EvalProgress | None = None
        self._spinner: Spinner | None = None
        self._live: Live | None = None

    def __enter__(self) -> ImproveProgress:
        if self.live:
            from rich.live import Live
            from rich.spinner import Spinner

            self._spinner = Spinner("dots", text=self.step + "…")
            self._live = Live(self._spinner, console=self.out, transient=True)
            self._live.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._live is not None:
            self._live.__exit__(exc_type, exc, traceback)
            self._live = None

    def status_line(self) -> str:
        """The live line: the step, questions, eval runs of the phase, verifications."""
        parts = [self.step.replace("_", " "), _count(self.questions, "question")]
        if self.eval is not None:
            parts.append(eval_line(self.eval))
        parts.append(_count(self.verifications, "verification"))
        return " · ".join(parts)

    async def on_event(self, event: CycleEvent) -> None:
        """A step of the cycle: printed whole, and counted in the live line."""
        self.step = event.step
        if event.step == "question_asked":
            self.questions += 1
        elif event.step == "verification_completed":
            self.verifications += 1
        self.out.print(cycle_event_line(event))
        self._update()

    def on_eval_run(self, progress: EvalProgress) -> None:
        """An eval run finished: the live line counts it; a plain line at each quarter."""
        self.eval = progress
        if self.live:
            self._update()
        elif _at_a_quarter(progress):
            self.out.print(f"   · {eval_line(progress)}", markup=False, highlight=False)

    def _update(self) -> None:
        """Redraw the live line now: a run's count shows as it happens, not at the next tick."""
        if self._live is not None and self._spinner is not None:
            self._spinner.update(text=self.status_line())
            self._live.refresh()


def _count(n: int, noun: str) -> str:
    """``1 question``, ``2 questions``."""
    return f"{n} {noun}" + ("" if n == 1 else "s")
