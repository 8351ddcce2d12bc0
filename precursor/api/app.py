"""The web application: the HTTP API under ``/api/v1`` and the dashboard under ``/dashboard``, in one process.

>>> from precursor.api.settings import ApiSettings
>>> app = create_app(ApiSettings(tokens="a-token-of-sixteen-chars"), KafkaSettings())
>>> sorted(p for p in app.openapi()["paths"] if "machines" in p)[:2]
['/api/v1/machines/at-risk', '/api/v1/machines/{machine_id}']
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from precursor.api.auth import TokenChecker
from precursor.api.routes import router
from precursor.api.schemas import Health
from precursor.api.settings import ApiSettings
from precursor.contracts.settings import KafkaSettings
from precursor.store.queries import StoreAttacher

log = logging.getLogger("precursor.api")

DASHBOARD_DIR = Path(__file__).parent / "dashboard"

# Everything the dashboard loads comes from this server: no CDN, no inline script, no third-party anything.
DASHBOARD_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        b"font-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-cache"),
]


def _version() -> str:
    try:
        return metadata.version("precursor")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def _where(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("query", "path", "header", "body", "cookie"):
        place = {"query": "query parameter", "path": "path parameter", "header": "header", "body": "body"}.get(
            parts[0], parts[0]
        )
        rest = ".".join(parts[1:])
        return f"{place} {rest}" if rest else place
    return ".".join(parts) or "request"


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


async def _validation_error(_request: Request, err: Exception) -> JSONResponse:
    """422 with one sentence per problem naming the parameter and its value, plus FastAPI's structured list."""
    assert isinstance(err, RequestValidationError)
    problems = []
    for e in err.errors():
        where = _where(tuple(e.get("loc", ())))
        value = f"={_shown(e['input'])}" if "input" in e and e.get("type") != "missing" else ""
        problems.append(f"{where}{value}: {e.get('msg', 'invalid')}")
    errors = [{k: v for k, v in e.items() if k in ("loc", "msg", "type")} for e in err.errors()]
    return JSONResponse({"detail": "; ".join(problems), "errors": errors}, status.HTTP_422_UNPROCESSABLE_CONTENT)


class DashboardHeaders:
    """Adds the content security policy and friends to everything under ``/dashboard``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/dashboard"):
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *DASHBOARD_HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    yield
    app.state.store.close()


def create_app(settings: ApiSettings, kafka: KafkaSettings) -> FastAPI:
    """The app for these settings. Refuses to build without at least one token: no token, no data."""
    app = FastAPI(
        title="Precursor API",
        version=_version(),
        description=(
            "What is at risk now, why and since when; machine histories with failures and lead times; alerts; "
            "model versions, rollout and quality; read-only SQL; and a live tail of predictions and alerts. "
            "Every data endpoint needs `Authorization: Bearer <token>`."
        ),
        # FastAPI's own docs pages load their scripts from a CDN; the OpenAPI document itself is served.
        docs_url=None,
        redoc_url=None,
        lifespan=_lifespan,
    )
    app.state.settings = settings
    app.state.kafka = kafka
    app.state.tokens = TokenChecker(settings.token_values())
    app.state.store = StoreAttacher(settings.store_path, wait_s=settings.store_wait_s)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.include_router(router)

    @app.get("/api/v1/health", response_model=Health, tags=["health"], summary="Liveness (no token needed)")
    def health() -> dict[str, str]:
        return {"status": "ok", "version": _version()}

    @app.get("/", include_in_schema=False)
    def root() -> RedirectResponse:
        return RedirectResponse("/dashboard/", status_code=status.HTTP_307_TEMPORARY_REDIRECT)

    app.mount("/dashboard", StaticFiles(directory=DASHBOARD_DIR, html=True), name="dashboard")
    app.add_middleware(DashboardHeaders)
    return app


def app_from_env() -> FastAPI:
    """The app from ``PRECURSOR_API_*`` and ``PRECURSOR_KAFKA_*`` variables (for ``uvicorn --factory``)."""
    return create_app(ApiSettings(), KafkaSettings())
