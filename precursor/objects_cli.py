"""``precursor objects install|serve``: the local S3-compatible server (gofakes3) for development and the tests."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Annotated

import typer

from infra.maven_jars import MissingToolError
from infra.object_store_server import LocalS3, ObjectStoreServerError, install_s3_server
from precursor.common import fail
from precursor.contracts.settings import PrecursorSettings

objects_app = typer.Typer(
    help="A local S3-compatible server, for pointing the labeled dataset and the model registry at s3:// URLs.",
    no_args_is_help=True,
)


@objects_app.command("install")
def objects_install() -> None:
    """Build the local S3 server once with `go install` (setup time: nothing is downloaded when it runs)."""
    try:
        typer.echo(f"local S3 server: {install_s3_server(report=typer.echo)}")
    except (MissingToolError, ObjectStoreServerError) as err:
        raise fail(str(err), code=1) from None


@objects_app.command("serve")
def objects_serve(
    port: Annotated[int, typer.Option("--port", help="port on 127.0.0.1")] = 9000,
    bucket: Annotated[str, typer.Option("--bucket", help="bucket created at start")] = "precursor",
    data_dir: Annotated[
        Path | None, typer.Option("--data-dir", help="where the buckets are kept [default: <state>/objects]")
    ] = None,
) -> None:
    """Run the local S3 server in the foreground until Ctrl-C, and print the variables that point clients at it."""
    server = LocalS3(data_dir or PrecursorSettings().state_dir / "objects", port=port, bucket=bucket)
    try:
        server.up()
    except ObjectStoreServerError as err:
        raise fail(str(err), code=1) from None
    typer.echo(f"serving s3://{bucket} at {server.endpoint_url} (Ctrl-C stops it); clients need:")
    typer.echo(f"  export PRECURSOR_S3_ENDPOINT_URL={server.endpoint_url}")
    typer.echo("  export AWS_ACCESS_KEY_ID=local AWS_SECRET_ACCESS_KEY=local   # any key: it checks none")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.down(report=typer.echo)
