"""Errors a service raises; each front end maps them once (HTTP problem types, CLI exit codes)."""

from __future__ import annotations

from typing import Any


class ServiceError(Exception):
    #: stable slug: the end of the problem `type` URI and the CLI's error kind
    code = "error"

    def __init__(self, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.extra = extra


class NotFound(ServiceError):
    code = "not-found"


class InvalidInput(ServiceError):
    code = "invalid-request"


class BadRequest(ServiceError):
    """The request is malformed at the protocol level (HTTP 400), not a bad parameter value (422)."""

    code = "bad-request"


class MissingIdempotencyKey(BadRequest):
    code = "idempotency-key-missing"


class InvalidIdempotencyKey(BadRequest):
    """Not a key by `domain.idempotency`: too long, or a character outside printable ASCII."""

    code = "idempotency-key-invalid"


class Conflict(ServiceError):
    code = "conflict"


class IdempotencyKeyReused(Conflict):
    code = "idempotency-key-reused"


class IdempotencyKeyInFlight(Conflict):
    code = "idempotency-key-in-flight"


class InsufficientCredits(ServiceError):
    code = "insufficient-credits"


class IllegalState(Conflict):
    code = "illegal-state"


class Unavailable(ServiceError):
    code = "service-unavailable"


class Overloaded(Unavailable):
    """New work is refused until a backlog drains; `retry_after_s` becomes the Retry-After header."""

    code = "overloaded"


class RateLimited(ServiceError):
    """The tenant's request rate limit (429); `retry_after_s` becomes Retry-After."""

    code = "rate-limited"


class TooManyStreams(ServiceError):
    """An event stream beyond the tenant's or the process's cap (429); `retry_after_s` becomes Retry-After."""

    code = "too-many-streams"


class ModerationRejected(ServiceError):
    """The input moderator refused the prompt or a reference (422): nothing was reserved or created."""

    code = "moderation-rejected"


class Forbidden(ServiceError):
    """A signed URL's signature is wrong or expired (the signature is the credential): 403."""

    code = "forbidden"


class PayloadTooLarge(ServiceError):
    """A streamed body is larger than what was declared: 413."""

    code = "payload-too-large"


class Unauthorized(ServiceError):
    """The caller could not be authenticated (e.g. a callback whose signature does not verify)."""

    code = "unauthorized"
