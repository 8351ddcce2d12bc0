"""Where the labeled dataset and the model registry live: a local folder (the default) or an object store URL.

A *location* is a local path (``Path``) or an fsspec URL (``s3://bucket/prefix``; a ``str``). Everything that reads
or writes a location goes through :func:`filesystem`, which opens the fsspec filesystem that holds it. S3 needs the
``s3`` extra (``pip install 'precursor[s3]'``: fsspec and s3fs); without it the error names that extra.

Credentials and the endpoint come from :class:`ObjectStoreSettings`: ``PRECURSOR_S3_*`` variables, or the standard
``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN`` / ``AWS_REGION`` / ``AWS_ENDPOINT_URL``.
With none set, s3fs falls back on the usual AWS chain (profiles, instance roles). Secrets are ``SecretStr``: they never
show in a repr, a log line or a validation error.

>>> as_location("s3://bucket/labeled"), as_location("/data/labeled"), as_location("file:///data/labeled")
('s3://bucket/labeled', PosixPath('/data/labeled'), PosixPath('/data/labeled'))
>>> join("s3://bucket/registry/", "precursor-lm", "1.0"), join(Path("/r"), "precursor-lm")
('s3://bucket/registry/precursor-lm/1.0', PosixPath('/r/precursor-lm'))
>>> s = ObjectStoreSettings(access_key_id="AKIA1", secret_access_key="hunter2")
>>> "hunter2" in repr(s), s.storage_options("s3")["secret"]
(False, 'hunter2')
"""

from __future__ import annotations

import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AliasChoices, BeforeValidator, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

S3_EXTRA = "s3"
S3_PROTOCOLS = ("s3", "s3a")


class ObjectStoreError(RuntimeError):
    """An object store location that cannot be reached or used; the text says which and why."""


class MissingExtraError(ObjectStoreError):
    """The fsspec implementation a URL needs is not installed."""


def is_url(location: Path | str) -> bool:
    """Whether ``location`` names an object store (``s3://...``) rather than a local path (``file://`` is local)."""
    if isinstance(location, Path):
        return False
    scheme = urllib.parse.urlsplit(location).scheme
    return "://" in location and len(scheme) > 1 and scheme != "file"


def as_location(value: Any) -> Any:
    """A URL stays a ``str``; a local path (or ``file://`` URL) becomes a ``Path``; anything else goes to pydantic."""
    if isinstance(value, str):
        if is_url(value):
            return value
        if value.startswith("file://"):
            return Path(urllib.parse.unquote(urllib.parse.urlsplit(value).path))
        return Path(value)
    return value


Location = Annotated[Path | str, BeforeValidator(as_location)]
"""A settings field that takes a local folder or an object store URL (``s3://bucket/prefix``)."""


def join(location: Path | str, *parts: str) -> Path | str:
    """``location`` with ``parts`` appended: a ``Path`` for a local one, a URL for a URL."""
    if isinstance(location, Path):
        return location.joinpath(*parts)
    return "/".join([location.rstrip("/"), *(p.strip("/") for p in parts)])


def describe(location: Path | str) -> str:
    """How messages name a location: the URL, or the absolute local path."""
    return location if isinstance(location, str) else str(Path(location).absolute())


class ObjectStoreSettings(BaseSettings):
    """How to reach an S3-compatible object store. Each field also reads the standard AWS variable named beside it."""

    # hide_input_in_errors: a validation error would otherwise print what it was given, secrets included.
    model_config = SettingsConfigDict(
        env_prefix="PRECURSOR_S3_", extra="forbid", hide_input_in_errors=True, populate_by_name=True
    )

    endpoint_url: str | None = Field(
        None,
        validation_alias=AliasChoices("PRECURSOR_S3_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
        description="an S3-compatible server (http://host:port); default: AWS",
    )
    region: str | None = Field(
        None, validation_alias=AliasChoices("PRECURSOR_S3_REGION", "AWS_REGION", "AWS_DEFAULT_REGION")
    )
    access_key_id: str | None = Field(
        None, validation_alias=AliasChoices("PRECURSOR_S3_ACCESS_KEY_ID", "AWS_ACCESS_KEY_ID")
    )
    secret_access_key: SecretStr | None = Field(
        None, validation_alias=AliasChoices("PRECURSOR_S3_SECRET_ACCESS_KEY", "AWS_SECRET_ACCESS_KEY")
    )
    session_token: SecretStr | None = Field(
        None, validation_alias=AliasChoices("PRECURSOR_S3_SESSION_TOKEN", "AWS_SESSION_TOKEN")
    )
    addressing_style: Literal["auto", "path", "virtual"] = Field(
        "auto", description="'path' for servers that do not serve buckets as host names"
    )
    anonymous: bool = Field(False, description="unsigned requests (public buckets)")

    def storage_options(self, protocol: str) -> dict[str, Any]:
        """The fsspec options for ``protocol``: these settings for S3, nothing for any other filesystem."""
        if protocol not in S3_PROTOCOLS:
            return {}
        options: dict[str, Any] = {}
        if self.anonymous:
            options["anon"] = True
        if self.access_key_id:
            options["key"] = self.access_key_id
        if self.secret_access_key:
            options["secret"] = self.secret_access_key.get_secret_value()
        if self.session_token:
            options["token"] = self.session_token.get_secret_value()
        if self.endpoint_url:
            options["endpoint_url"] = self.endpoint_url
        if self.region:
            options["client_kwargs"] = {"region_name": self.region}
        if self.addressing_style != "auto":
            options["config_kwargs"] = {"s3": {"addressing_style": self.addressing_style}}
        return options


def filesystem(location: Path | str, settings: ObjectStoreSettings | None = None) -> tuple[AbstractFileSystem, str]:
    """The fsspec filesystem that holds ``location``, and the path of ``location`` in it.

    Raises :class:`MissingExtraError` naming the extra to install when the URL's filesystem is not installed.
    """
    try:
        import fsspec
    except ImportError:
        raise MissingExtraError(
            f"{describe(location)}: object storage needs fsspec: pip install 'precursor[{S3_EXTRA}]'"
        ) from None
    if not is_url(location):
        from fsspec.implementations.local import LocalFileSystem

        return LocalFileSystem(), str(Path(location).absolute())
    assert isinstance(location, str)
    protocol = urllib.parse.urlsplit(location).scheme
    options = (settings or ObjectStoreSettings()).storage_options(protocol)
    try:
        return fsspec.core.url_to_fs(location, **options)
    except ImportError as err:
        extra = S3_EXTRA if protocol in S3_PROTOCOLS else None
        hint = f"pip install 'precursor[{extra}]'" if extra else str(err)
        raise MissingExtraError(f"{location}: the {protocol}:// filesystem is not installed: {hint}") from None
    except ValueError as err:  # an unknown protocol
        raise ObjectStoreError(f"{location}: {err}") from None


def is_local(fs: AbstractFileSystem) -> bool:
    """Whether ``fs`` is the local disk, where a rename is atomic (an object store has no rename, but a PUT is)."""
    from fsspec.implementations.local import LocalFileSystem

    return isinstance(fs, LocalFileSystem)
