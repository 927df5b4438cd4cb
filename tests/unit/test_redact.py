"""Masking secrets, signed URLs and prompts (observability.redact) and the logging setup that applies it."""

from __future__ import annotations

import io
import json
import logging
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
import structlog

from aivedio_engine.config import load_settings
from aivedio_engine.observability.logging import RedactingFilter, configure_logging, envelope_ids, task_context
from aivedio_engine.observability.redact import REDACTED, Redactor

KEY = "avk_Q2hlY2tpbmdUaGlzS2V5SXNMb25nRW5vdWdoMTIzNDU"
WHSEC = "whsec_c2ltLXRlc3Qtc2VjcmV0LTAxMjM0NTY3ODlhYmNkZWY="
PROMPT = "a red fox running through snow"
r = Redactor(["sk-live-vendor-key-0123", "short"])


@pytest.mark.parametrize(
    "text, gone, kept",
    [
        (f"auth failed for {KEY}", KEY, "avk_" + REDACTED),
        (f"secret={WHSEC}", WHSEC, "whsec_" + REDACTED),
        ("Authorization: Bearer abcdefghijklmnop", "abcdefghijklmnop", "Authorization: "),
        ("{'authorization': 'Bearer abcdefghijkl', 'x': 1}", "abcdefghijkl", "'x': 1"),
        ("call with token Bearer eyJhbGciOi.payload.sig", "eyJhbGciOi", "Bearer " + REDACTED),
        (
            "GET /v1/objects/t/a.mp4?expires=1700000000&sig=AbC_dEf-123 HTTP/1.1",
            "AbC_dEf-123",
            "/v1/objects/t/a.mp4?<redacted> HTTP/1.1",
        ),
        (
            "https://b.s3.amazonaws.com/k.mp4?X-Amz-Algorithm=AWS4&X-Amz-Credential=AKIA%2F2024&X-Amz-Signature=deadbeef",
            "deadbeef",
            "https://b.s3.amazonaws.com/k.mp4?<redacted>",
        ),
        ("'url': 'http://127.0.0.1:9/outputs/j.mp4?expires=1&sig=zz9'}", "zz9", "/outputs/j.mp4?<redacted>'}"),
        ("verify(sig='QmFzZTY0U2ln', expires=1)", "QmFzZTY0U2ln", "sig='<redacted>'"),
        ("postgresql+psycopg://aivedio:hunter22@db:5432/x", "hunter22", "://aivedio:<redacted>@db:5432/x"),
        ("vendor said: invalid key sk-live-vendor-key-0123", "sk-live-vendor-key-0123", "invalid key " + REDACTED),
        (f'{{"prompt": "{PROMPT}", "model": "m"}}', PROMPT, '"prompt": "<redacted:30 chars>", "model": "m"'),
        (f"SubmitRequest(prompt='{PROMPT}', model='m')", PROMPT, "prompt='<redacted:30 chars>', model='m'"),
        ("GET /v1/generations?prompt=a%20red%20fox&limit=2", "a%20red%20fox", "prompt=<redacted:13 chars>&limit=2"),
    ],
)
def test_text_masks_each_kind_and_keeps_the_context(text: str, gone: str, kept: str) -> None:
    masked = r.text(text)
    assert gone not in masked
    assert kept in masked
    assert r.text(masked) == masked  # masking twice (logger filter, then handler filter) changes nothing


@pytest.mark.parametrize(
    "text",
    [
        "GET /v1/generations?limit=10&cursor=abc HTTP/1.1",  # a query without credentials is useful, and kept
        "what? nothing to see here",
        "the short literal stays: short",  # configured values shorter than 6 characters would mask ordinary words
        "review_prompt_terms = ['x']",
        "Basic facts about tokens",
    ],
)
def test_text_leaves_harmless_text_alone(text: str) -> None:
    assert r.text(text) == text


def test_values_are_masked_by_key_recursively() -> None:
    @dataclass
    class Request:
        prompt: str
        model: str

    event = {
        "event": "submitting",
        "prompt": PROMPT,
        "headers": {"Authorization": f"Bearer {KEY}", "X-Api-Key": "k" * 20, "Accept": "video/mp4"},
        "params": [{"negative_prompt": "blurry"}, {"duration_s": 4}],
        "request": Request(PROMPT, "m"),
        "body": f'{{"prompt": "{PROMPT}"}}'.encode(),
        "count": 3,
        "_record": object(),  # structlog's bookkeeping passes through untouched
    }
    out = r.event(event)
    assert out["prompt"] == "<redacted:30 chars>"
    assert out["headers"] == {"Authorization": REDACTED, "X-Api-Key": REDACTED, "Accept": "video/mp4"}
    assert out["params"] == [{"negative_prompt": "<redacted:6 chars>"}, {"duration_s": 4}]
    assert PROMPT not in out["request"] and "model='m'" in out["request"]
    assert PROMPT not in out["body"]
    assert out["count"] == 3 and out["_record"] is event["_record"]


def test_filter_masks_a_library_record_in_place() -> None:
    record = logging.LogRecord(
        "dramatiq.worker.WorkerThread",
        logging.WARNING,
        __file__,
        1,
        "Failed to process message %s",
        ("fetch({'url': 'http://h/o.mp4?sig=abc123'})",),
        None,
    )
    try:
        raise ValueError(f"upstream refused {KEY}")
    except ValueError:
        import sys

        record.exc_info = sys.exc_info()
    assert RedactingFilter(r).filter(record) is True
    assert "abc123" not in record.getMessage() and "o.mp4?<redacted>" in record.getMessage()
    assert record.args == ()
    assert KEY not in (record.exc_text or "") and "avk_<redacted>" in (record.exc_text or "")


def _json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_json_lines_carry_bound_ids_and_are_masked(restore_logging: None) -> None:
    settings = load_settings(
        None,
        {
            "logging": {"format": "json", "level": "DEBUG"},
            "providers": {"local": {"api_key": "sk-live-vendor-key-0123"}},
        },
    )
    out = io.StringIO()
    configure_logging(settings, stream=out)
    envelope = SimpleNamespace(
        aggregate_id="T-1", trace_id="R-1", payload={"task_id": "T-1", "attempt_id": "A-1", "prompt": PROMPT}
    )
    with task_context(envelope):
        logging.getLogger("aivedio.test").info("fetching %s", "http://h/o.mp4?expires=1&sig=s3cr3t")
        structlog.get_logger("aivedio.test").info("submitting", prompt=PROMPT, api_key="sk-live-vendor-key-0123")
    logging.getLogger("aivedio.test").info("outside")
    first, second, third = _json_lines(out.getvalue())
    assert first["event"] == "fetching http://h/o.mp4?<redacted>"
    assert {k: first[k] for k in ("trace_id", "task_id", "attempt_id")} == {
        "trace_id": "R-1",
        "task_id": "T-1",
        "attempt_id": "A-1",
    }
    assert second["prompt"] == "<redacted:30 chars>" and second["api_key"] == REDACTED
    assert second["task_id"] == "T-1" and second["level"] == "info" and second["logger"] == "aivedio.test"
    assert "task_id" not in third  # the block ended: nothing leaks into later lines of the thread
    assert "s3cr3t" not in out.getvalue() and PROMPT not in out.getvalue()


def test_console_format_and_quiet_default_for_interactive_commands(restore_logging: None) -> None:
    out = io.StringIO()
    configure_logging(load_settings(None, {}), stream=out, default_level="WARNING")
    logging.getLogger("aivedio.test").info("hidden: the level was not configured")
    logging.getLogger("aivedio.test").warning("signal %s received; shutting down", "SIGTERM")
    assert "hidden" not in out.getvalue() and "signal SIGTERM received; shutting down" in out.getvalue()
    assert not out.getvalue().lstrip().startswith("{")

    configured = io.StringIO()
    configure_logging(load_settings(None, {"logging": {"level": "INFO"}}), stream=configured, default_level="WARNING")
    logging.getLogger("aivedio.test").info("shown: the level was configured")
    assert "shown" in configured.getvalue()
    assert len([h for h in logging.getLogger().handlers if getattr(h, "_aivedio_handler", False)]) == 1


def test_envelope_ids_name_the_task_of_an_attempt_event() -> None:
    submit = SimpleNamespace(aggregate_id="A-1", trace_id=None, payload={"attempt_id": "A-1"})
    observed = SimpleNamespace(aggregate_id="T-2", trace_id="R", payload={"status": "running"})
    assert envelope_ids(submit) == {"attempt_id": "A-1"}
    assert envelope_ids(observed) == {"trace_id": "R", "task_id": "T-2"}
