"""What the OpenAPI schema cannot say about an operation: how it behaves (notes) and a curl example.

Keyed by "METHOD path" as the schema spells it; a key that names no operation is an error when the reference is
generated, and an operation with no entry gets a plain example made from its method and path.
"""

from __future__ import annotations

AUTH = '-H "Authorization: Bearer $KEY"'
JSON = '-H "Content-Type: application/json"'
BASE = "localhost:8000"

#: "METHOD path" → (notes, curl example)
EXAMPLES: dict[str, tuple[str, str]] = {
    "GET /healthz": ("", f"curl -s {BASE}/healthz"),
    "GET /readyz": ("", f"curl -s {BASE}/readyz"),
    "GET /v1/models": (
        "Models, prices and each model's limits (durations, aspect ratios, reference counts and sizes).",
        f"curl -s {AUTH} {BASE}/v1/models",
    ),
    "POST /v1/generations": (
        "202; same `Idempotency-Key` + same request → the original task as `GET /v1/generations/{id}` shows it now "
        "(`Idempotent-Replayed: true`; a finished one with its `outputs`, `output_assets` and `variants`, freshly "
        "signed); + different request → 409 `idempotency-key-reused`; still being created → 409 "
        "`idempotency-key-in-flight`; no key → "
        "400; a key outside the rule (*Idempotency keys* above) → 400 `idempotency-key-invalid`; not enough "
        "credits → 402; bad parameter → 422 (e.g. `n` — 1–4 outputs, part of the request and its "
        "hash, reserved as price × seconds × n — above the model's `max_outputs`, which `GET /v1/models` lists); "
        "the input moderation refuses the prompt or a reference → 422 `moderation-rejected` (nothing reserved; "
        "`[moderation]`); over the tenant's request rate → 429 `rate-limited` with `Retry-After` (nothing "
        "created); broker path "
        "stalled (an outbox row due for more than `limits.shed_outbox_age_s`, 300 s) → 503 `overloaded` with "
        "`Retry-After` (replays of keys already in are still answered).",
        f'curl -s -X POST {AUTH} -H "Idempotency-Key: order-42" {JSON} '
        """-d '{"prompt":"a red fox in snow","model":"local-v1","duration_s":4}' """
        f"{BASE}/v1/generations",
    ),
    "GET /v1/generations/{task_id}": (
        "The source of truth; `outputs` holds signed, expiring URLs of the derivatives once SUCCEEDED, "
        "`output_assets` each one's asset id, size and sha256 (both of the first output); "
        '`variants: [{"index", "outputs", "output_assets"}]` the same for every output of the request (`n`).',
        f"curl -s {AUTH} {BASE}/v1/generations/$ID",
    ),
    "GET /v1/generations/{task_id}/events": (
        "SSE, one `status` event per state change (`id:` = task version), `: ping` heartbeats, resume with "
        "`Last-Event-ID`; ends after a terminal state.",
        f"curl -sN {AUTH} {BASE}/v1/generations/$ID/events",
    ),
    "GET /v1/generations": (
        "Newest first, keyset pages; `?idempotency_key=K` finds the task a key made (the key's rule applies: "
        "*Idempotency keys* above). Each task as `GET /v1/generations/{id}` shows it, a SUCCEEDED one with its "
        "signed `outputs` and `variants`.",
        f'curl -s {AUTH} "{BASE}/v1/generations?status=QUEUED&limit=20"',
    ),
    "POST /v1/generations/{task_id}/cancel": (
        "Before dispatch: CANCELED and the reservation released; after it: CANCEL_REQUESTED.",
        f"curl -s -X POST {AUTH} {BASE}/v1/generations/$ID/cancel",
    ),
    "POST /v1/assets": (
        "An upload target for a reference image/video (server-generated key).",
        f"curl -s -X POST {AUTH} {JSON} "
        """-d '{"filename":"ref.png","size_bytes":12345,"content_type":"image/png"}' """
        f"{BASE}/v1/assets",
    ),
    "PUT /v1/uploads/{upload_id}": (
        "Upload to the returned target (embedded: signed `PUT` to the API; S3: presigned `POST` with the returned "
        "fields).",
        'curl -s -X PUT --data-binary @ref.png "$UPLOAD_URL"',
    ),
    "POST /v1/assets/{asset_id}/complete": (
        "Size/checksum check, magic number, ffprobe limits → READY or REJECTED.",
        f"curl -s -X POST {AUTH} {BASE}/v1/assets/$ASSET/complete",
    ),
    "GET /v1/assets/{asset_id}": ("", f"curl -s {AUTH} {BASE}/v1/assets/$ASSET"),
    "GET /v1/objects/{key}": ("Follow a signed URL from `outputs`.", 'curl -s -o proxy.mp4 "$SIGNED_URL"'),
    "GET /v1/playback/{asset_id}/index.m3u8": (
        "Follow the signed `hls` URL from `outputs`.",
        'curl -s "$HLS_URL"',
    ),
    "POST /v1/callbacks/{provider}": (
        "Provider webhooks, verified by signature over the raw body; a signed event whose ids overflow their "
        "columns or whose text holds NUL is kept as a rejected raw event (`provider_events.observation = "
        '{"rejected": why}`, never applied) and answered 200 `{"stored": 0}`, so the vendor does not retry it '
        "forever.",
        "(sent by providers)",
    ),
    "POST /v1/webhook-endpoints": (
        "201 with the `whsec_` `secret` (shown once); `events` (task statuses) optional; a private/loopback URL, an "
        "unknown event or a bad URL → 422.",
        f"curl -s -X POST {AUTH} {JSON} "
        """-d '{"url":"https://hooks.example.com/aivedio","events":["SUCCEEDED","FAILED_FINAL"]}' """
        f"{BASE}/v1/webhook-endpoints",
    ),
    "GET /v1/webhook-endpoints": ("Never the secret.", f"curl -s {AUTH} {BASE}/v1/webhook-endpoints"),
    "GET /v1/webhook-endpoints/{endpoint_id}": ("Never the secret.", f"curl -s {AUTH} {BASE}/v1/webhook-endpoints/$EP"),
    "DELETE /v1/webhook-endpoints/{endpoint_id}": (
        "204; undelivered messages to it become DEAD.",
        f"curl -s -X DELETE {AUTH} {BASE}/v1/webhook-endpoints/$EP",
    ),
    "POST /v1/webhook-endpoints/{endpoint_id}/rotate": (
        "A new secret (shown once); the old one also signs until `previous_secret_until`.",
        f"curl -s -X POST {AUTH} {BASE}/v1/webhook-endpoints/$EP/rotate",
    ),
    "POST /v1/projects": (
        "A System B project: `workflow`, `user_ref` (the end user it is for), `input` (`photo_asset_id` "
        "of a READY asset of yours + `script`), `formal`, `priority` 1–5 (absent: 2 formal, 3 preview; capped by the "
        "tenant's tier like generations). 201 with the project and its first steps; `Idempotency-Key` required (400 "
        "without; 400 `idempotency-key-invalid` outside the rule, *Idempotency keys* above); same key + same "
        "request → the same project (`Idempotent-Replayed: true`), + different request → "
        "409 `idempotency-key-reused`; a formal project for a user who has one open → 409 `user-project-open`; "
        "unknown workflow or a photo that is not your READY asset → 422.",
        f'curl -s -X POST {AUTH} -H "Idempotency-Key: p-1" {JSON} '
        """-d '{"workflow":"photo_story","user_ref":"u-7","input":{"photo_asset_id":"'$ASSET'","""
        """"script":"A morning. A walk."}}' """
        f"{BASE}/v1/projects",
    ),
    "GET /v1/projects/{project_id}": (
        "The project and every step: status, queue, progress, duration, cost, retries, error code and message, "
        "output asset and generation task ids, and each step's retry link; `cost_actual` is the sum of the steps'.",
        f"curl -s {AUTH} {BASE}/v1/projects/$P",
    ),
    "GET /v1/projects": ("Newest first, keyset pages.", f'curl -s {AUTH} "{BASE}/v1/projects?limit=20"'),
    "POST /v1/projects/{project_id}/cancel": (
        "Open steps are cancelled with it (their review items closed); repeating is harmless, a succeeded project "
        "→ 409.",
        f"curl -s -X POST {AUTH} {BASE}/v1/projects/$P/cancel",
    ),
    "POST /v1/projects/{project_id}/steps/{step_key}/retry": (
        "The retry entry: a failed or manual_required step back to pending on the same row with a fresh retry "
        "budget; any other status → 409 naming it.",
        f"curl -s -X POST {AUTH} {BASE}/v1/projects/$P/steps/plan/retry",
    ),
    "GET /v1/projects/{project_id}/events": (
        "SSE: a fresh stream starts with a `snapshot` (the project as it is), then the whole history: a `step` "
        "event per step transition and a `project` event per change of the project's status, each with `id:` = the "
        "project's event sequence number (resume with `Last-Event-ID`: exactly the later ones, no snapshot); "
        "`: ping` heartbeats; ends once succeeded or cancelled.",
        f"curl -sN {AUTH} {BASE}/v1/projects/$P/events",
    ),
}
