"""/v1/webhook-endpoints: a tenant's signed client webhooks (create → the secret once, list, delete, rotate).

Everything is scoped by the caller's key: another tenant's endpoint answers 404, exactly like a missing one.
"""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Response
from pydantic import BaseModel, ConfigDict, Field

from aivedio_engine.api.deps import Auth, Ctx
from aivedio_engine.services.webhooks import EndpointView, WithSecret

router = APIRouter(prefix="/v1/webhook-endpoints", tags=["webhooks"])


class CreateEndpointRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str = Field(min_length=1, max_length=2048)
    #: task statuses to receive (e.g. ["SUCCEEDED", "FAILED_FINAL"]); omitted or ["*"]: every status change
    events: list[str] | None = Field(default=None, max_length=32)


class Endpoint(BaseModel):
    id: str
    url: str
    events: list[str]
    created_at: str
    #: while a rotation's grace period runs, messages carry a second signature made with the old secret
    previous_secret_until: str | None


class EndpointWithSecret(Endpoint):
    #: the Standard Webhooks `whsec_` secret: shown here once, never again
    secret: str


class EndpointPage(BaseModel):
    data: list[Endpoint]


def render(view: EndpointView) -> dict[str, Any]:
    doc = view.to_json()
    doc.pop("tenant_id")
    return doc


def render_secret(created: WithSecret) -> EndpointWithSecret:
    return EndpointWithSecret(**render(created.endpoint), secret=created.secret)


@router.post("", status_code=201, response_model=EndpointWithSecret)
def create_endpoint(body: CreateEndpointRequest, response: Response, ctx: Ctx, principal: Auth) -> EndpointWithSecret:
    created = ctx.webhooks.add(principal.tenant_id, body.url, body.events)
    response.headers["Location"] = f"/v1/webhook-endpoints/{created.endpoint.id}"
    response.headers["Cache-Control"] = "no-store"  # the secret must not linger in a cache
    return render_secret(created)


@router.get("", response_model=EndpointPage)
def list_endpoints(ctx: Ctx, principal: Auth) -> EndpointPage:
    return EndpointPage(data=[Endpoint(**render(v)) for v in ctx.webhooks.list_endpoints(principal.tenant_id)])


@router.get("/{endpoint_id}", response_model=Endpoint)
def get_endpoint(endpoint_id: uuid.UUID, ctx: Ctx, principal: Auth) -> Endpoint:
    return Endpoint(**render(ctx.webhooks.get(principal.tenant_id, endpoint_id)))


@router.delete("/{endpoint_id}", status_code=204)
def delete_endpoint(endpoint_id: uuid.UUID, ctx: Ctx, principal: Auth) -> Response:
    ctx.webhooks.remove(principal.tenant_id, endpoint_id)
    return Response(status_code=204)


@router.post("/{endpoint_id}/rotate", response_model=EndpointWithSecret)
def rotate_secret(endpoint_id: uuid.UUID, response: Response, ctx: Ctx, principal: Auth) -> EndpointWithSecret:
    response.headers["Cache-Control"] = "no-store"
    return render_secret(ctx.webhooks.rotate(principal.tenant_id, endpoint_id))
