"""Logging: quiet by default as a library should be, configured only when a program asks.

Library modules log with ``get_logger(__name__)``: a logger that hands each event, through
structlog, to the standard ``logging`` module under the module's own name (``agentmend.loop.cycle``,
``agentmend.infrastructure.store.api``, ...). The record's message is the event and its key/value
pairs (``close_monitor_failed runs_lost=5 error='...'``), so even stdlib's bare last resort
shows what happened; the pairs are also the record's attributes (``record.event``,
``record.runs_lost``) for handlers that format their own. So an
application embedding agentmend decides what it sees, with the logging setup it already has:
nothing below WARNING unless it asks, and warnings through stdlib's last resort (stderr) when
it configured nothing. To see agentmend's steps::

    logging.basicConfig(level=logging.INFO)                  # everything at INFO, or only ours:
    logging.getLogger("agentmend").setLevel(logging.INFO)

Programs (the session, the ``agentmend`` command, the MCP server) call ``configure_logging``,
which renders agentmend's records, key/value pairs included, on stderr: the MCP server speaks
its protocol on stdout, and no face prints logs there.

structlog is imported when the first event passes its level, not before: importing it (and
the ``rich`` it looks for) is about a fifth of a short command's start, and a process that
logs nothing above the level it was given (most of them) never needs it.
"""

from __future__ import annotations

import logging
import sys
import traceback
from typing import TYPE_CHECKING, Any, TextIO

from agentmend.infrastructure.errors import InvalidArgument
from agentmend.infrastructure.redaction import redact
from agentmend.infrastructure.terminal_text import terminal_text

if TYPE_CHECKING:
    import structlog

__all__ = ["LOGGER_ROOT", "Logger", "configure_logging", "get_logger"]

LOGGER_ROOT = "agentmend"
"""The stdlib logger every agentmend logger sits under."""

# the attributes of a LogRecord: an event key with one of these names would make
# ``logging.Logger.makeRecord`` raise, so it is passed on with a trailing underscore
_RECORD_FIELDS = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


def _clear_of_record_fields(_: Any, __: str, event_dict: Any) -> Any:
    for key in [k for k in event_dict if k in _RECORD_FIELDS]:
        event_dict[f"{key}_"] = event_dict.pop(key)
    return event_dict


# set by ``_redact_values`` when the traceback shows a secret: it goes as redacted text instead
_NO_EXC_INFO = "_agentmend_no_exc_info"


def _redact_values(logger: Any, method: str, event_dict: Any) -> Any:
    """Every text of the event through the one redaction: no store password in a log line.

    A traceback that would show one is handed on as redacted text (``exception``) instead of
    the exception itself, which a host's handler would format as it is.
    """
    level = logging.getLevelName("ERROR" if method == "exception" else method.upper())
    enabled = not isinstance(logger, logging.Logger) or not isinstance(level, int)
    if not (enabled or logger.isEnabledFor(level)):
        return event_dict  # dropped by the level anyway: no work for what nobody sees
    for key, value in event_dict.items():
        if isinstance(value, str):
            event_dict[key] = redact(value)
        elif isinstance(value, BaseException):
            event_dict[key] = redact(str(value))
    info = event_dict.get("exc_info")
    if info or method == "exception":
        if isinstance(info, BaseException):
            info = (type(info), info, info.__traceback__)
        elif not isinstance(info, tuple):
            info = sys.exc_info()
        if info[0] is not None:
            shown = "".join(traceback.format_exception(*info))
            if redact(shown) != shown:
                event_dict.pop("exc_info", None)
                event_dict["exception"] = redact(shown)
                event_dict[_NO_EXC_INFO] = True
    return event_dict


def _to_log_kwargs(logger: Any, method: str, event_dict: Any) -> Any:
    """structlog's ``render_to_log_kwargs``, with the pairs in the message as well."""
    import structlog

    redacted_traceback = event_dict.pop(_NO_EXC_INFO, False)
    kwargs = structlog.stdlib.render_to_log_kwargs(logger, method, event_dict)
    if redacted_traceback:
        kwargs["exc_info"] = False  # logger.exception() would attach the raw one again
    extra, event = kwargs["extra"], kwargs["msg"]
    kwargs["msg"] = " ".join([str(event), *(f"{key}={value!r}" for key, value in extra.items())])
    extra["event"] = event
    return kwargs


class Logger:
    """A library logger: structlog's stdlib logger, built when an event first passes the level.

    An event below the stdlib logger's level is dropped before structlog sees it, as
    structlog's own chain would drop it at the end; what passes goes through the same chain
    (redaction, record-field clashes, key/value pairs in the message).
    """

    __slots__ = ("_bound", "_stdlib")

    def __init__(self, stdlib: logging.Logger) -> None:
        self._stdlib = stdlib
        self._bound: Any = None

    def _emit(self, level: int, method: str, event: str, args: Any, pairs: Any) -> None:
        if not self._stdlib.isEnabledFor(level):
            return
        if self._bound is None:
            import structlog

            # a race here builds two equal wrappers and keeps one: no lock needed
            self._bound = structlog.wrap_logger(
                self._stdlib,
                wrapper_class=structlog.stdlib.BoundLogger,
                processors=[_redact_values, _clear_of_record_fields, _to_log_kwargs],
            )
        getattr(self._bound, method)(event, *args, **pairs)

    def debug(self, event: str, *args: Any, **pairs: Any) -> None:
        self._emit(logging.DEBUG, "debug", event, args, pairs)

    def info(self, event: str, *args: Any, **pairs: Any) -> None:
        self._emit(logging.INFO, "info", event, args, pairs)

    def warning(self, event: str, *args: Any, **pairs: Any) -> None:
        self._emit(logging.WARNING, "warning", event, args, pairs)

    def error(self, event: str, *args: Any, **pairs: Any) -> None:
        self._emit(logging.ERROR, "error", event, args, pairs)

    def exception(self, event: str, *args: Any, **pairs: Any) -> None:
        """``error`` with the exception being handled attached, as ``logging`` does."""
        self._emit(logging.ERROR, "exception", event, args, pairs)

    def critical(self, event: str, *args: Any, **pairs: Any) -> None:
        self._emit(logging.CRITICAL, "critical", event, args, pairs)


def get_logger(name: str) -> Logger:
    """A library logger for module ``name``: events go to the stdlib logger of that name.

    Every module of the package is named ``agentmend.<...>``, so its events sit under the one
    ``agentmend`` logger; another name is put under it. Nothing is configured here or at import;
    the application's logging setup applies.
    """
    if name != LOGGER_ROOT and not name.startswith(f"{LOGGER_ROOT}."):
        name = f"{LOGGER_ROOT}.{name}"
    return Logger(logging.getLogger(name))


class _OwnHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler ``configure_logging`` installs, so a second call replaces it."""


def configure_logging(
    level: str | int = "INFO", *, stream: TextIO | None = None, json: bool = False
) -> None:
    """Render agentmend's log records to ``stream`` (stderr by default) from ``level`` on.

    For programs, not libraries: it sets up the ``agentmend`` stdlib logger only (the rest
    of the process's logging is left alone), as text or JSON lines with every key/value pair.

    Raises:
        InvalidArgument: ``level`` is not a logging level (a ``ValueError`` too).
    """
    numeric = logging.getLevelName(level.upper()) if isinstance(level, str) else level
    if not isinstance(numeric, int):
        raise InvalidArgument("level", level, "is not a log level")
    handler = _OwnHandler(stream or sys.stderr)
    handler.setFormatter(_RecordRenderer(json=json))
    logger = logging.getLogger(LOGGER_ROOT)
    for old in [h for h in logger.handlers if isinstance(h, _OwnHandler)]:
        logger.removeHandler(old)
    logger.addHandler(handler)
    logger.setLevel(numeric)
    logger.propagate = False  # the program chose this output; no second copy via the root


class _RecordRenderer(logging.Formatter):
    """structlog's ``ProcessorFormatter`` for our records, built when the first one is shown."""

    def __init__(self, *, json: bool) -> None:
        super().__init__()
        self._json = json
        self._inner: logging.Formatter | None = None

    def format(self, record: logging.LogRecord) -> str:
        if self._inner is None:
            self._inner = _processor_formatter(json=self._json)
        return self._inner.format(record)


def _processor_formatter(*, json: bool) -> logging.Formatter:
    import structlog

    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()  # ASCII: every control character is \u-escaped
        if json
        else _escaped(structlog.dev.ConsoleRenderer(colors=False))
    )
    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[
            structlog.stdlib.add_log_level,
            structlog.stdlib.ExtraAdder(),  # the pairs, and ``event`` as the bare event
            structlog.processors.TimeStamper(fmt="iso", utc=True),
        ],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            # a traceback is text like the rest: rendered here, then redacted
            structlog.processors.format_exc_info,
            _redact_values,
            renderer,
        ],
    )


def _escaped(renderer: structlog.typing.Processor) -> structlog.typing.Processor:
    """``renderer``, its lines escaped for a terminal: logged names and texts are anyone's."""

    def render(logger: Any, method: str, event: structlog.typing.EventDict) -> Any:
        rendered = renderer(logger, method, event)
        return terminal_text(rendered) if isinstance(rendered, str) else rendered

    return render
