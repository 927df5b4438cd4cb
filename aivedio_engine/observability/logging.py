"""Structured logs: structlog over the standard library, one line per event, secrets masked.

Every `logging.getLogger(...)` record (ours, Dramatiq's, uvicorn's, httpx's) and every `structlog.get_logger()`
event ends in one root handler whose ProcessorFormatter adds the ids bound for the current request or actor
call (`trace_id`, `task_id`, `attempt_id`, kept in contextvars so concurrent threads and requests never mix),
masks secrets (`redact`), and renders a JSON line (`logging.format = "json"`) or a console line.

Masking happens twice on purpose: the processor chain masks event dicts key by key (structlog events), and a
`RedactingFilter` masks the already-formatted message of library records (Dramatiq prints a failing message's
arguments, uvicorn the request line with its query string) — also on the loggers of libraries that install
handlers of their own, which would otherwise bypass the root handler.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date, datetime
from typing import IO, TYPE_CHECKING, Any

import structlog
from structlog.processors import CallsiteParameter

from aivedio_engine.observability.redact import Redactor

if TYPE_CHECKING:
    from aivedio_engine.config import Settings

#: marks the handler installed here, so configuring again replaces it instead of doubling every line
_HANDLER_MARK = "_aivedio_handler"
#: loggers that libraries may give handlers of their own (uvicorn's dictConfig): masked on the logger itself
_SELF_HANDLED = ("uvicorn", "uvicorn.error", "uvicorn.access")
#: a line per outgoing HTTP request (every provider poll) or per server start-up step: shown from WARNING
#: unless the level is DEBUG
_CHATTY = ("httpx", "httpcore", "uvicorn.error")

#: what every line carries besides its event; contextvars first, so ids bound by the caller come along
_SHARED: list[Any] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
    structlog.processors.CallsiteParameterAdder({CallsiteParameter.PROCESS, CallsiteParameter.THREAD_NAME}),
]
#: `extra=` fields of standard-library records that become fields of the line (others, like uvicorn's
#: color_message copy of the message, are left out)
EXTRA_FIELDS = ("actor", "outcome", "duration_ms", "request_id")


def configure_logging(settings: Settings, *, stream: IO[str] | None = None, default_level: str | None = None) -> None:
    """Route all logging of this process through one structlog-formatted, masking handler on `stream`.

    `default_level` applies when the configuration does not set `logging.level` itself: an interactive command
    keeps the terminal for its own progress display unless the operator asked for more.
    """
    level: str = settings.logging.level
    if default_level is not None and "level" not in settings.logging.model_fields_set:
        level = default_level
    redactor = Redactor(secret_values(settings))
    out = stream or sys.stderr
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *_SHARED,
            structlog.stdlib.PositionalArgumentsFormatter(),
            structlog.processors.StackInfoRenderer(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        # the chain above does not depend on settings (the handler does), so cached loggers stay correct
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*_SHARED, structlog.stdlib.ExtraAdder(allow=EXTRA_FIELDS)],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,  # tracebacks become text before they are masked
                lambda _logger, _name, event: redactor.event(event),
                _renderer(settings.logging.format, out),
            ],
        )
    )
    setattr(handler, _HANDLER_MARK, True)
    root = logging.getLogger()
    for existing in list(root.handlers):
        if getattr(existing, _HANDLER_MARK, False):
            root.removeHandler(existing)
        else:  # an embedding application's handler stays, but must not print secrets either
            _set_filter(existing, redactor)
    _set_filter(handler, redactor)
    root.addHandler(handler)
    root.setLevel(level)
    for name in _SELF_HANDLED:
        _set_filter(logging.getLogger(name), redactor)
    for name in _CHATTY:
        logging.getLogger(name).setLevel(
            level if level == "DEBUG" else max(logging.WARNING, logging.getLevelName(level))
        )


def secret_values(settings: Settings) -> list[str]:
    """Configured secrets, masked wherever they appear verbatim (a vendor echoing its key in an error)."""
    values = [settings.storage.secret_access_key, settings.storage.signing_key]
    for provider in settings.providers.values():
        values.append(provider.api_key)
        values.extend(provider.webhook_secrets)
    return [v.get_secret_value() for v in values if v.get_secret_value()]


class RedactingFilter(logging.Filter):
    """Masks a library record's formatted message (and traceback) in place; never drops a record."""

    def __init__(self, redactor: Redactor) -> None:
        super().__init__()
        self.redactor = redactor
        self._plain = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        if hasattr(record, "_logger"):  # a structlog event: masked key by key in the processor chain
            return True
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record; logging reports it when it formats it
            return True
        masked = self.redactor.text(message)
        if masked != message:
            record.msg, record.args = masked, ()
        if record.exc_info and not record.exc_text:
            # for handlers with a plain Formatter, which reuse exc_text instead of formatting exc_info again
            record.exc_text = self.redactor.text(self._plain.formatException(record.exc_info))
        return True


def _set_filter(target: logging.Filterer, redactor: Redactor) -> None:
    for old in [f for f in target.filters if isinstance(f, RedactingFilter)]:
        target.removeFilter(old)
    target.addFilter(RedactingFilter(redactor))


def _renderer(fmt: str, out: IO[str]) -> Any:
    if fmt == "json":
        return structlog.processors.JSONRenderer(default=_json_default)
    isatty = getattr(out, "isatty", None)
    return structlog.dev.ConsoleRenderer(
        colors=bool(isatty and isatty()), exception_formatter=structlog.dev.plain_traceback
    )


def _json_default(value: Any) -> Any:
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    return str(value)  # UUID, Decimal, Path: their text, not their repr


# --- ids of the work at hand ------------------------------------------------------------------------------


def envelope_ids(envelope: Any) -> dict[str, str]:
    """trace_id, task_id and attempt_id of a broker envelope (`services.consume.Envelope`), where it has them.

    Most events are about a task (aggregate_id); a submit request is about an attempt and names its task in the
    payload.
    """
    payload = envelope.payload or {}
    attempt_id = payload.get("attempt_id")
    aggregate = str(envelope.aggregate_id)
    task_id = payload.get("task_id") or (aggregate if aggregate != attempt_id else None)
    ids = {"trace_id": envelope.trace_id, "task_id": task_id, "attempt_id": attempt_id}
    return {k: str(v) for k, v in ids.items() if v}


@contextmanager
def task_context(envelope: Any) -> Iterator[None]:
    """Every line logged in this thread inside the block carries the envelope's ids."""
    with structlog.contextvars.bound_contextvars(**envelope_ids(envelope)):
        yield
