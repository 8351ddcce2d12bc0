"""Settings of the HTTP API and dashboard: where to listen, which store to read, who may read it.

Tokens come from ``PRECURSOR_API_TOKENS`` (comma-separated) and/or a file (``PRECURSOR_API_TOKEN_FILE``, one token a
line). They are ``SecretStr``: they never appear in a repr, a log line or an error message.

>>> s = ApiSettings(tokens="alpha-token-123456,beta-token-7890123", store="/tmp/p.duckdb")
>>> len(s.token_values())
2
>>> "alpha" in repr(s)
False
>>> ApiSettings(tokens="short")
Traceback (most recent call last):
...
pydantic_core._pydantic_core.ValidationError: 1 validation error for ApiSettings
tokens
  Value error, every API token must be at least 16 characters; one has 5 ...
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from precursor.contracts.object_store import Location
from precursor.contracts.settings import PrecursorSettings, StoreLocation
from precursor.store.queries import DEFAULT_THRESHOLD

MIN_TOKEN_CHARS = 16


def _split_tokens(text: str) -> list[str]:
    return [t.strip() for t in text.replace("\n", ",").split(",") if t.strip() and not t.strip().startswith("#")]


class ApiSettings(BaseSettings):
    """Everything ``precursor serve`` needs besides the Kafka settings."""

    model_config = SettingsConfigDict(env_prefix="PRECURSOR_API_", extra="forbid")

    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=1, le=65535)] = 8700
    store: StoreLocation | None = Field(
        None, description="prediction store file or postgresql:// URL; default <state_dir>/store/predictions.duckdb"
    )
    tokens: SecretStr | None = Field(None, description="comma-separated bearer tokens that may read")
    token_file: Path | None = Field(None, description="file with one bearer token a line")
    risk_threshold: Annotated[float, Field(ge=0, le=1)] = DEFAULT_THRESHOLD
    sql_timeout_s: Annotated[float, Field(gt=0, le=120)] = 5.0
    sql_max_rows: Annotated[int, Field(ge=1, le=10_000)] = 1000
    sql_max_bytes: Annotated[int, Field(ge=1024, le=256 * 1024 * 1024)] = 8 * 1024 * 1024
    store_wait_s: Annotated[float, Field(ge=0, le=60)] = 5.0
    live_keepalive_s: Annotated[float, Field(gt=0, le=300)] = 15.0
    live_poll_ms: Annotated[int, Field(ge=10, le=5000)] = 200
    model_registry: Location | None = Field(
        None,
        description="model registry (a folder, or an object store URL such as s3://bucket/registry) whose versions' "
        "calibration the models page shows; None: not shown",
    )

    @field_validator("tokens")
    @classmethod
    def _long_enough(cls, tokens: SecretStr | None) -> SecretStr | None:
        if tokens is not None:
            for token in _split_tokens(tokens.get_secret_value()):
                if len(token) < MIN_TOKEN_CHARS:
                    raise ValueError(
                        f"every API token must be at least {MIN_TOKEN_CHARS} characters; one has {len(token)}"
                    )
        return tokens

    @property
    def store_path(self) -> Path | str:
        return self.store or PrecursorSettings().store_path

    def token_values(self) -> list[bytes]:
        """Every accepted token, as bytes for a constant-time comparison."""
        found: list[str] = []
        if self.tokens is not None:
            found += _split_tokens(self.tokens.get_secret_value())
        if self.token_file is not None:
            try:
                found += _split_tokens(self.token_file.read_text())
            except OSError as err:
                raise ValueError(f"token_file={self.token_file}: cannot read it ({err.strerror})") from None
        short = [t for t in found if len(t) < MIN_TOKEN_CHARS]
        if short:
            raise ValueError(f"every API token must be at least {MIN_TOKEN_CHARS} characters; one has {len(short[0])}")
        return [t.encode() for t in found]
