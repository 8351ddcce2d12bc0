"""Where the labeled dataset and the model registry live: a local folder (the default) or an object store URL.

A *location* is a local path (``Path``) or an fsspec URL (``s3://bucket/prefix``; a ``str``). Everything that reads
or writes a location goes through :func:`filesystem`, which opens the fsspec filesystem that holds it. S3 needs the
``s3`` extra (``pip install 'precursor[s3]'``: fsspec and s3fs); without it the error names that extra.

Credentials and the endpoint come from :class:`ObjectStoreSettings`: ``PRECURSOR_S3_*`` variables, or the standard
``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN`` / ``AWS_REGION`` / ``AWS_ENDPOINT_URL``.
With none set, s3fs falls back on the usual AWS chain (profiles, instance roles). Secrets are ``SecretStr``: they never
show in a repr, a log line or a validation error.

A store that refuses or cannot be reached fails in one way wherever it is used: :func:`filesystem` asks the store
once per process and bucket (one listing of the prefix) and raises :class:`ObjectStoreAccessError`, whose text names
the URL, the endpoint, what failed and the variable to check, never a secret; :func:`explain` turns what the store's
client raises later into the same error. Without this a missing bucket would read as an empty prefix (s3fs calls it
``FileNotFoundError``), and a wrong key would surface as a botocore traceback from wherever it was first used.

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
from collections.abc import Iterator
from contextlib import contextmanager
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


FailureKind = Literal[
    "credentials refused", "access denied", "no credentials", "no such bucket", "endpoint unreachable", "request failed"
]


class ObjectStoreAccessError(ObjectStoreError):
    """The object store refused a request or could not be reached; ``kind`` says which, the text names the URL, the
    endpoint and the setting to check. Made by :func:`explain`."""

    def __init__(self, message: str, kind: FailureKind) -> None:
        # Both in args: a copy made from them (pickling, Beam's step annotation) keeps the kind.
        super().__init__(message, kind)
        self.kind: FailureKind = kind

    def __str__(self) -> str:
        return str(self.args[0])


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
    # botocore's own default (legacy, 5 attempts) spent 9.7 s on an endpoint that refused every connection before the
    # error reached anyone; AWS's standard mode with 3 attempts gives up in 1.9 s and still backs off on throttling.
    retry_mode: Literal["standard", "adaptive", "legacy"] = Field(
        "standard", validation_alias=AliasChoices("PRECURSOR_S3_RETRY_MODE", "AWS_RETRY_MODE")
    )
    max_attempts: int = Field(
        3,
        ge=1,
        validation_alias=AliasChoices("PRECURSOR_S3_MAX_ATTEMPTS", "AWS_MAX_ATTEMPTS"),
        description="attempts per request, the first included",
    )

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
        config: dict[str, Any] = {"retries": {"mode": self.retry_mode, "total_max_attempts": self.max_attempts}}
        if self.addressing_style != "auto":
            config["s3"] = {"addressing_style": self.addressing_style}
        options["config_kwargs"] = config
        return options


def filesystem(location: Path | str, settings: ObjectStoreSettings | None = None) -> tuple[AbstractFileSystem, str]:
    """The fsspec filesystem that holds ``location``, and the path of ``location`` in it.

    Raises :class:`MissingExtraError` naming the extra to install when the URL's filesystem is not installed, and
    :class:`ObjectStoreAccessError` when an S3 store refuses the credentials, has no such bucket or does not answer
    (asked the first time this process meets the bucket with these settings).
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
    settings = settings or ObjectStoreSettings()
    options = settings.storage_options(protocol)
    try:
        fs, path = fsspec.core.url_to_fs(location, **options)
    except ImportError as err:
        extra = S3_EXTRA if protocol in S3_PROTOCOLS else None
        hint = f"pip install 'precursor[{extra}]'" if extra else str(err)
        raise MissingExtraError(f"{location}: the {protocol}:// filesystem is not installed: {hint}") from None
    except ValueError as err:  # an unknown protocol
        raise ObjectStoreError(f"{location}: {err}") from None
    if protocol in S3_PROTOCOLS:
        _reach(fs, path, location, settings)
    return fs, path


_REACHED: set[tuple[Any, str]] = set()
"""(filesystem, bucket) pairs this process has reached once: each is asked only the first time."""


def _reach(fs: AbstractFileSystem, path: str, location: str, settings: ObjectStoreSettings) -> None:
    """One listing of the prefix, the first time this filesystem (its endpoint and credentials) meets this bucket, so
    that refused credentials, a missing bucket or a dead endpoint fail here, before any work, as one
    :class:`ObjectStoreAccessError`. A listing the bucket's policy denies passes: the store knew the key, and a
    principal that may only read one object (an edge fetching a packed archive) needs no listing."""
    bucket, _, prefix = path.partition("/")
    seen = (fs._fs_token, bucket)
    if seen in _REACHED:
        return
    try:
        fs.call_s3("list_objects_v2", Bucket=bucket, Prefix=prefix, MaxKeys=1)
    except Exception as err:
        failure = explain(err, location, settings)
        if failure is None:
            raise
        if failure.kind != "access denied":
            raise failure from None
    _REACHED.add(seen)


def variables(field: str) -> str:
    """The environment variables an :class:`ObjectStoreSettings` field is read from, as an error names them."""
    alias = ObjectStoreSettings.model_fields[field].validation_alias
    names = [str(n) for n in alias.choices] if isinstance(alias, AliasChoices) else [f"PRECURSOR_S3_{field.upper()}"]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def _causes(err: BaseException) -> Iterator[BaseException]:
    """``err`` and what it was raised from or while handling (s3fs raises its own error from botocore's)."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def explain(
    err: BaseException, location: Path | str, settings: ObjectStoreSettings | None = None
) -> ObjectStoreAccessError | None:
    """What the store's client raised for a request about ``location``, as an :class:`ObjectStoreAccessError` that
    names the URL, the endpoint, what failed and the variable to check; None when ``err`` did not come from the store
    (a missing key under a bucket that exists is left to the caller, as ``FileNotFoundError``).

    The text is made from the URL, the endpoint, the access key id (an identifier, not a secret) and the store's
    error code: never from the settings' secrets.
    """
    try:
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            ConnectTimeoutError,
            EndpointConnectionError,
            NoCredentialsError,
            PartialCredentialsError,
        )
    except ImportError:  # without the s3 extra nothing could have reached a store
        return None
    settings = settings or ObjectStoreSettings()
    url = describe(location)
    endpoint = settings.endpoint_url
    store = f"the object store at {_shown(endpoint)}" if endpoint else "AWS S3 (default endpoint)"
    key_id = repr(settings.access_key_id) if settings.access_key_id else "(from the AWS profile or role)"
    endpoint_vars = variables("endpoint_url")

    def failure(kind: FailureKind, detail: str, check: str) -> ObjectStoreAccessError:
        return ObjectStoreAccessError(f"{url}: {kind}: {detail}; check {check}", kind)

    unexplained: BaseException | None = None
    for cause in _causes(err):
        if isinstance(cause, ObjectStoreAccessError):
            return cause
        if isinstance(cause, (EndpointConnectionError, ConnectTimeoutError)):
            what = "timed out" if isinstance(cause, ConnectTimeoutError) else "no connection"
            return failure(
                "endpoint unreachable",
                f"{store} does not answer ({what})",
                f"{endpoint_vars}, and that the store is running and reachable from here",
            )
        if isinstance(cause, (NoCredentialsError, PartialCredentialsError)):
            return failure(
                "no credentials",
                f"no complete credentials to sign requests to {store} with",
                f"{variables('access_key_id')} and {variables('secret_access_key')} "
                f"(or {variables('anonymous')}=true for a public bucket)",
            )
        if isinstance(cause, ClientError):
            error = cause.response.get("Error", {})
            code = str(error.get("Code") or "")
            if code == "NoSuchBucket":
                bucket = error.get("BucketName") or urllib.parse.urlsplit(url).netloc
                return failure(
                    "no such bucket", f"{store} has no bucket {bucket!r}", f"the bucket in the URL and {endpoint_vars}"
                )
            if code == "InvalidAccessKeyId":
                return failure(
                    "credentials refused",
                    f"{store} knows no access key id {key_id} ({code})",
                    variables("access_key_id"),
                )
            if code == "SignatureDoesNotMatch":
                return failure(
                    "credentials refused",
                    f"{store} refuses the secret key given for access key id {key_id} ({code})",
                    variables("secret_access_key"),
                )
            if code in ("ExpiredToken", "InvalidToken", "TokenRefreshRequired"):
                return failure(
                    "credentials refused", f"{store} refuses the session token ({code})", variables("session_token")
                )
            if code == "AuthorizationHeaderMalformed":  # most often a region that is not the bucket's
                return failure(
                    "credentials refused",
                    f"{store} refuses how the request was signed ({code}: {error.get('Message', '')})",
                    variables("region"),
                )
            status = cause.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("AccessDenied", "AllAccessDisabled", "403") or status == 403:
                # A HEAD request's 403 has no body: a wrong key and a missing permission look the same.
                reason = code if code != "403" else "403 Forbidden: wrong credentials, or no permission"
                return failure(
                    "access denied",
                    f"{store} denies access key id {key_id} this request ({reason})",
                    f"{variables('access_key_id')}, {variables('secret_access_key')} and the bucket's policy",
                )
            unexplained = unexplained or cause
        elif isinstance(cause, BotoCoreError):
            unexplained = unexplained or cause
    if unexplained is not None:
        return failure(
            "request failed",
            f"{store} failed the request: {type(unexplained).__name__}: {unexplained}",
            f"{endpoint_vars} and the store's own log",
        )
    return None


@contextmanager
def explained(location: Path | str, settings: ObjectStoreSettings | None = None) -> Iterator[None]:
    """Whatever the store's client raises inside the block, as the :class:`ObjectStoreAccessError` that names
    ``location`` (see :func:`explain`); anything that did not come from the store passes unchanged.

    :func:`filesystem`'s first listing catches a store that refuses the key or does not answer; this covers what only a
    later request meets: a key whose policy may list but not write (s3fs raises a bare ``PermissionError: Access
    Denied`` that names no URL), an endpoint that goes away mid-run.
    """
    try:
        yield
    except ObjectStoreError:
        raise
    except Exception as err:
        failure = explain(err, location, settings)
        if failure is None:
            raise
        raise failure from None


def is_local(fs: AbstractFileSystem) -> bool:
    """Whether ``fs`` is the local disk, where a rename is atomic (an object store has no rename, but a PUT is)."""
    from fsspec.implementations.local import LocalFileSystem

    return isinstance(fs, LocalFileSystem)


def _shown(endpoint: str) -> str:
    """An endpoint URL as an error may show it: any ``user:password@`` in it left out.

    >>> _shown("http://key:secret@127.0.0.1:9000/"), _shown("https://s3.example.com")
    ('http://127.0.0.1:9000/', 'https://s3.example.com')
    """
    parts = urllib.parse.urlsplit(endpoint)
    if "@" not in parts.netloc:
        return endpoint
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))
