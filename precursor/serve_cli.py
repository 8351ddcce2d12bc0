"""``precursor serve``: the HTTP API and the dashboard, in one process.

Tokens come from ``PRECURSOR_API_TOKENS`` or a token file. With neither, a random token is created once in
``<state_dir>/api-token`` (readable by its owner only) and its path, never the token itself, is printed.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Annotated

import typer

from precursor.common import StoreOption, fail

TOKEN_FILE_NAME = "api-token"


def ensure_token_file(path: Path) -> bool:
    """Create ``path`` holding a new random token unless it exists. Returns whether it was created."""
    if path.exists():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_urlsafe(32) + "\n")
    return True


def serve_command(
    host: Annotated[str | None, typer.Option("--host", help="address to listen on [default: 127.0.0.1]")] = None,
    port: Annotated[int | None, typer.Option("--port", min=1, max=65535, help="[default: 8700]")] = None,
    store: StoreOption = None,
    token_file: Annotated[
        Path | None,
        typer.Option("--token-file", help="file of accepted tokens, one a line [default: <state>/api-token]"),
    ] = None,
    log_level: Annotated[str, typer.Option("--log-level", help="uvicorn log level")] = "info",
) -> None:
    """Serve the HTTP API (/api/v1, OpenAPI at /openapi.json) and the live dashboard (/dashboard)."""
    import uvicorn
    from pydantic import ValidationError

    from precursor.api.app import create_app
    from precursor.api.settings import ApiSettings
    from precursor.contracts.settings import KafkaSettings, PrecursorSettings

    overrides: dict[str, object] = {}
    if host is not None:
        overrides["host"] = host
    if port is not None:
        overrides["port"] = port
    if store is not None:
        overrides["store"] = store
    if token_file is not None:
        overrides["token_file"] = token_file
    try:
        settings = ApiSettings(**overrides)  # type: ignore[arg-type]
        if settings.tokens is None and settings.token_file is None:
            default = PrecursorSettings().state_dir / TOKEN_FILE_NAME
            if ensure_token_file(default):
                typer.echo(f"created an API token in {default} (readable by you only); send it as a bearer token")
            settings = settings.model_copy(update={"token_file": default})
        app = create_app(settings, KafkaSettings())
    except (ValidationError, ValueError) as err:
        raise fail(str(err)) from None
    from precursor.store.location import redact

    typer.echo(
        f"dashboard: http://{settings.host}:{settings.port}/dashboard/  API: /api/v1  "
        f"store: {redact(settings.store_path)}"
    )
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=log_level, proxy_headers=False)
