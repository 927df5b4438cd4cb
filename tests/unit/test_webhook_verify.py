"""Webhook forgery / replay corpus against the Standard Webhooks verify helper.

Every case names its expected outcome: ACCEPT returns the verified message, REJECT raises CallbackRejected.
Anything else escaping (ValueError, UnicodeDecodeError, binascii.Error …) fails the test: that would be a 500
at the callback route, and a 500 makes the vendor retry forever.

What this helper does NOT decide: a replay of a valid delivery inside the tolerance window is accepted here
(W2/W7) — dedupe by `webhook-id` is the event store's job. Body-size 413 (W18) is the route's job before the
body is read; the helper's own `max_body_bytes` check is a second line.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import SecretStr
from starlette.datastructures import Headers

from aivedio_engine.providers import webhooks
from aivedio_engine.providers.base import CallbackRejected
from aivedio_engine.providers.webhooks import new_secret, sign_webhook, verify_webhook

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
TS = int(NOW.timestamp())
SECRET = new_secret(b"current-endpoint-secret-32bytes!")
OLD = new_secret(b"previous-endpoint-secret-32bytes")
OTHER_TENANT = new_secret(b"tenant-b-endpoint-secret-32byte!")
MSG_ID = "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W"
BODY = b'{"id":"job_1","status":"succeeded","event_id":"msg_2KWPBgLlAfxdpx2AI54pPJ85f4W"}'
ACCEPT, REJECT = "accept", "reject"


def sig(secret: str, msg_id: str = MSG_ID, ts: int | str = TS, body: bytes = BODY) -> str:
    """A v1 signature computed independently of the code under test (HMAC over id.ts.raw-bytes)."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    mac = hmac.new(key, f"{msg_id}.{ts}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def headers(msg_id: str = MSG_ID, ts: int | str = TS, signature: str | None = None) -> dict[str, str]:
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(ts),
        "webhook-signature": signature if signature is not None else sig(SECRET, msg_id, ts),
    }


def without(name: str) -> dict[str, str]:
    h = headers()
    del h[name]
    return h


@dataclass
class Case:
    name: str
    expect: str
    headers: Any = field(default_factory=headers)
    body: Any = BODY
    secrets: list[Any] = field(default_factory=lambda: [SECRET])
    now: datetime = NOW
    kwargs: dict[str, Any] = field(default_factory=dict)


def _ts(delta: int) -> dict[str, str]:
    return headers(ts=TS + delta, signature=sig(SECRET, ts=TS + delta))


VALID = sig(SECRET)
CORPUS = [
    # W1, W14, W15, W16: signatures and keys
    Case("W1 valid signature, fresh timestamp", ACCEPT),
    Case("wrong secret", REJECT, secrets=[OTHER_TENANT]),
    Case("W16 other endpoint's secret", REJECT, headers=headers(signature=sig(OTHER_TENANT))),
    Case("rotation: receiver holds old+new, signed with new", ACCEPT, secrets=[OLD, SECRET]),
    Case(
        "rotation: receiver holds old+new, signed with old",
        ACCEPT,
        headers=headers(signature=sig(OLD)),
        secrets=[OLD, SECRET],
    ),
    Case(
        "rotation: sender signs with both, receiver new only",
        ACCEPT,
        headers=headers(signature=f"{sig(OLD)} {sig(SECRET)}"),
    ),
    Case("W15 old key only after the overlap ended", REJECT, headers=headers(signature=sig(OLD))),
    Case("W14 garbage signature plus a valid one", ACCEPT, headers=headers(signature=f"v1,AAAA!!!! {VALID}")),
    Case("secret given as SecretStr", ACCEPT, secrets=[SecretStr(SECRET)]),
    Case("a broken configured secret next to a good one", ACCEPT, secrets=["whsec_", "not-base64-$$$", SECRET]),
    Case("no secret configured", REJECT, secrets=[]),
    # W3, W4, tampering
    Case("W3 one body byte flipped", REJECT, body=BODY.replace(b"job_1", b"job_2")),
    Case(
        "W4 body JSON re-serialized",
        REJECT,
        body=b'{"id": "job_1", "status": "succeeded", "event_id": "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W"}',
    ),
    Case("tampered webhook-id", REJECT, headers=headers(msg_id="msg_other", signature=VALID)),
    Case("tampered timestamp (+1 s, still fresh)", REJECT, headers=headers(ts=TS + 1, signature=VALID)),
    Case(
        "signature truncated by one byte",
        REJECT,
        headers=headers(signature="v1," + base64.b64encode(base64.b64decode(VALID[3:])[:-1]).decode()),
    ),
    # W5, W6, W8: time
    Case("W5 timestamp now-301 s", REJECT, headers=_ts(-301)),
    Case("W5 timestamp now+301 s", REJECT, headers=_ts(301)),
    Case("W6 timestamp now-299 s", ACCEPT, headers=_ts(-299)),
    Case("W6 timestamp now+299 s", ACCEPT, headers=_ts(299)),
    Case("timestamp exactly now-300 s", ACCEPT, headers=_ts(-300)),
    Case("W8 captured request replayed after 10 min", REJECT, now=NOW + timedelta(minutes=10)),
    Case("custom tolerance 60 s, 61 s old", REJECT, headers=_ts(-61), kwargs={"tolerance_s": 60}),
    Case("naive `now` is read as UTC", ACCEPT, now=NOW.replace(tzinfo=None)),
    # W9: headers missing or empty
    Case("W9 missing webhook-id", REJECT, headers=without("webhook-id")),
    Case("W9 missing webhook-timestamp", REJECT, headers=without("webhook-timestamp")),
    Case("W9 missing webhook-signature", REJECT, headers=without("webhook-signature")),
    Case("W9 empty webhook-id", REJECT, headers={**headers(), "webhook-id": ""}),
    Case("W9 empty webhook-timestamp", REJECT, headers={**headers(), "webhook-timestamp": ""}),
    Case("W9 empty webhook-signature", REJECT, headers={**headers(), "webhook-signature": ""}),
    Case("no headers at all", REJECT, headers={}),
    Case("header names in mixed case", ACCEPT, headers={k.title(): v for k, v in headers().items()}),
    Case(
        "duplicate webhook-id headers",
        REJECT,
        headers=Headers(
            raw=[
                (b"webhook-id", MSG_ID.encode()),
                (b"webhook-id", b"msg_other"),
                (b"webhook-timestamp", str(TS).encode()),
                (b"webhook-signature", VALID.encode()),
            ]
        ),
    ),
    Case("header value that is not a string", REJECT, headers={**headers(), "webhook-timestamp": None}),
    # W10, W13: signature header grammar (the library crashes on some of these)
    Case("W10 `v1` without a comma", REJECT, headers=headers(signature="v1")),
    Case("W10 `v1,` with nothing after it", REJECT, headers=headers(signature="v1,")),
    Case("W10 `,,`", REJECT, headers=headers(signature=",,")),
    Case("W10 10 KB signature header", REJECT, headers=headers(signature=f"{VALID} " + "v1," + "A" * 10_000)),
    Case("non-base64 signature", REJECT, headers=headers(signature="v1,%%%not*base64%%%")),
    Case("base64 without padding", REJECT, headers=headers(signature=VALID.rstrip("="))),
    Case("W13 only an unknown version v2", REJECT, headers=headers(signature="v2," + VALID[3:])),
    Case("W13 only v1a (asymmetric) when HMAC is configured", REJECT, headers=headers(signature="v1a," + VALID[3:])),
    Case(
        "many signatures (over the cap), one valid",
        REJECT,
        headers=headers(signature=" ".join(["v1,AAAA"] * 12 + [VALID])),
    ),
    Case("signature separated by a tab", ACCEPT, headers=headers(signature=f"v2,xyz\t{VALID}")),
    # W11, W12, W17: body and header value grammar
    Case(
        "W11 non-UTF-8 body, correctly HMACed over its bytes",
        REJECT,
        body=b"\xff\xfe{}",
        headers=headers(signature=sig(SECRET, body=b"\xff\xfe{}")),
    ),
    Case("W12 timestamp 1e20", REJECT, headers=headers(ts="1e20", signature=sig(SECRET, ts="1e20"))),
    Case("W12 timestamp -1", REJECT, headers=headers(ts="-1", signature=sig(SECRET, ts="-1"))),
    Case("W12 timestamp NaN", REJECT, headers=headers(ts="NaN", signature=sig(SECRET, ts="NaN"))),
    Case("W12 timestamp as float", REJECT, headers=headers(ts=f"{TS}.0", signature=sig(SECRET, ts=f"{TS}.0"))),
    Case("W12 timestamp with a leading +", REJECT, headers=headers(ts=f"+{TS}", signature=sig(SECRET, ts=f"+{TS}"))),
    Case(
        "W12 timestamp with inner space", REJECT, headers=headers(ts=f"{TS}"[:5] + " " + f"{TS}"[5:], signature=VALID)
    ),
    Case("W12 timestamp far in the future (year 5000)", REJECT, headers=headers(ts="95617584000", signature=VALID)),
    Case(
        "W17 webhook-id containing a dot",
        REJECT,
        headers=headers(msg_id="msg.1", signature=sig(SECRET, msg_id="msg.1")),
    ),
    Case(
        "W17 webhook-id over 128 chars",
        REJECT,
        headers=headers(msg_id="m" * 129, signature=sig(SECRET, msg_id="m" * 129)),
    ),
    Case("W17 webhook-id with non-ASCII", REJECT, headers=headers(msg_id="msg_é", signature="v1,AAAA")),
    Case("W18 body over max_body_bytes", REJECT, kwargs={"max_body_bytes": 16}),
    Case("body as str instead of raw bytes", REJECT, body=BODY.decode()),
    Case("empty body, validly signed", ACCEPT, body=b"", headers=headers(signature=sig(SECRET, body=b""))),
]


@pytest.mark.parametrize("case", CORPUS, ids=lambda c: c.name)
def test_corpus(case: Case) -> None:
    def run() -> Any:
        return verify_webhook(case.headers, case.body, case.secrets, case.now, **case.kwargs)

    if case.expect == ACCEPT:
        verified = run()
        assert verified.body == case.body
        assert verified.msg_id == (case.headers.get("webhook-id") or case.headers.get("Webhook-Id"))
    else:
        with pytest.raises(CallbackRejected) as info:
            run()
        # the reason is for logs; it must never echo a secret
        assert not any(str(s) in str(info.value) for s in (SECRET, OLD, OTHER_TENANT))


def test_corpus_size_and_outcomes() -> None:
    assert len(CORPUS) >= 25
    assert {c.expect for c in CORPUS} == {ACCEPT, REJECT}
    assert len({c.name for c in CORPUS}) == len(CORPUS)


def test_w2_w7_identical_replay_inside_the_window_passes_verification() -> None:
    """The helper cannot know what was applied; it hands back the id the store dedupes on."""
    first = verify_webhook(headers(), BODY, [SECRET], NOW)
    again = verify_webhook(headers(), BODY, [SECRET], NOW + timedelta(minutes=4))
    assert first.msg_id == again.msg_id == MSG_ID and first.body == again.body


def test_signed_but_not_json_is_rejected_when_parsed() -> None:
    body = b"not json"
    verified = verify_webhook(headers(signature=sig(SECRET, body=body)), body, [SECRET], NOW)
    with pytest.raises(CallbackRejected):
        verified.json()


def test_sign_webhook_round_trips_and_matches_an_independent_hmac() -> None:
    signed = sign_webhook([SECRET, OLD], MSG_ID, NOW, BODY)
    assert signed == {
        "webhook-id": MSG_ID,
        "webhook-timestamp": str(TS),
        "webhook-signature": f"{sig(SECRET)} {sig(OLD)}",
    }
    assert verify_webhook(signed, BODY, [OLD], NOW).timestamp == NOW
    with pytest.raises(ValueError):
        sign_webhook([], MSG_ID, NOW, BODY)
    with pytest.raises(ValueError):
        new_secret(b"too short")


def test_w29_signatures_are_compared_in_constant_time() -> None:
    source = inspect.getsource(webhooks)
    assert "hmac.compare_digest" in source
    assert "expected ==" not in source and "== expected" not in source


_header_values = st.one_of(st.text(max_size=80), st.sampled_from(["v1", "v1,", ",,", VALID, f"{TS}", MSG_ID, ""]))


@settings(max_examples=300, deadline=None)
@given(
    msg_id=_header_values,
    ts=_header_values,
    signature=_header_values,
    body=st.binary(max_size=64),
    drop=st.sets(st.sampled_from(["webhook-id", "webhook-timestamp", "webhook-signature"])),
)
def test_fuzz_only_ever_accepts_or_rejects(msg_id: str, ts: str, signature: str, body: bytes, drop: set[str]) -> None:
    h = {"webhook-id": msg_id, "webhook-timestamp": ts, "webhook-signature": signature}
    for name in drop:
        del h[name]
    try:
        verify_webhook(h, body, [SECRET], NOW)
    except CallbackRejected:
        pass


@pytest.mark.parametrize(
    "poison",
    [
        lambda: {"webhook-id": MSG_ID, "webhook-timestamp": str(TS), "webhook-signature": "v1," + "A" * 44 + " " * 3},
        lambda: _Exploding(),
    ],
)
def test_hostile_header_objects_are_rejections(poison: Callable[[], Any]) -> None:
    with pytest.raises(CallbackRejected):
        verify_webhook(poison(), BODY, [SECRET], NOW)


class _Exploding(dict):  # type: ignore[type-arg]
    def items(self) -> Any:
        raise RuntimeError("a broken header container")
