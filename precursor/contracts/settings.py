"""Settings shared by every component that talks to Kafka.

TLS and SASL are configuration: set ``PRECURSOR_KAFKA_SECURITY_PROTOCOL=SASL_SSL`` and friends (or the same keys in a
config file) and every producer and consumer picks them up; no code changes. Secrets are ``SecretStr``: they print as
``**********`` in logs, reprs and error messages.

>>> s = KafkaSettings(bootstrap_servers="k1:9093,k2:9093", security_protocol="SASL_SSL",
...                   sasl_mechanism="PLAIN", sasl_plain_username="edge", sasl_plain_password="hunter2")
>>> "hunter2" in repr(s)
False
>>> s.client_kwargs()["sasl_plain_password"] == "hunter2", "hunter2" in repr(s.client_kwargs())
(True, False)
>>> s.client_kwargs()["bootstrap_servers"]
['k1:9093', 'k2:9093']
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from precursor.contracts.topics import Topics


class _Concealed(str):
    """A secret as a client library needs it, a ``str``, but with a repr that hides it: kafka-python's admin client
    logs its whole configuration (passwords included) at DEBUG."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "'**********'"


class KafkaSettings(BaseSettings):
    """Where the broker is and how to authenticate. Defaults fit the local broker that ``precursor kafka up`` starts."""

    # hide_input_in_errors: a validation error would otherwise print what it was given, passwords included.
    model_config = SettingsConfigDict(env_prefix="PRECURSOR_KAFKA_", extra="forbid", hide_input_in_errors=True)

    bootstrap_servers: str = Field("localhost:9092", description="comma-separated host:port list")
    topic_prefix: str = Field("precursor", pattern=r"^[A-Za-z0-9._\-]+$")
    client_id: str = "precursor"
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER", "GSSAPI"] | None = None
    sasl_plain_username: str | None = None
    sasl_plain_password: SecretStr | None = None
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_password: SecretStr | None = None
    ssl_check_hostname: bool = True
    request_timeout_ms: int = Field(30_000, gt=0)

    @model_validator(mode="after")
    def _sasl_complete(self) -> KafkaSettings:
        if self.security_protocol.startswith("SASL") and self.sasl_mechanism is None:
            raise ValueError(f"security_protocol={self.security_protocol} needs sasl_mechanism")
        if self.sasl_mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512") and not (
            self.sasl_plain_username and self.sasl_plain_password
        ):
            raise ValueError(f"sasl_mechanism={self.sasl_mechanism} needs sasl_plain_username and sasl_plain_password")
        return self

    @property
    def topics(self) -> Topics:
        return Topics(self.topic_prefix)

    @property
    def servers(self) -> list[str]:
        return [s.strip() for s in self.bootstrap_servers.split(",") if s.strip()]

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for any kafka-python client (producer, consumer, admin)."""
        kwargs: dict[str, Any] = {
            "bootstrap_servers": self.servers,
            "client_id": self.client_id,
            "security_protocol": self.security_protocol,
            "request_timeout_ms": self.request_timeout_ms,
        }
        if self.sasl_mechanism:
            kwargs["sasl_mechanism"] = self.sasl_mechanism
        if self.sasl_plain_username:
            kwargs["sasl_plain_username"] = self.sasl_plain_username
        if self.sasl_plain_password:
            kwargs["sasl_plain_password"] = _Concealed(self.sasl_plain_password.get_secret_value())
        if self.security_protocol in ("SSL", "SASL_SSL"):
            kwargs["ssl_check_hostname"] = self.ssl_check_hostname
            for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
                if getattr(self, name):
                    kwargs[name] = getattr(self, name)
            if self.ssl_password:
                kwargs["ssl_password"] = _Concealed(self.ssl_password.get_secret_value())
        return kwargs


def _store_location(value: object) -> object:
    """A PostgreSQL URL stays a string (a Path would fold its ``//``); anything else is a file path."""
    if isinstance(value, str) and value.startswith(("postgresql://", "postgres://")):
        return value
    return Path(value) if isinstance(value, str) else value


StoreLocation = Annotated[Path | str, BeforeValidator(_store_location)]
"""The prediction store: a DuckDB file, or a PostgreSQL database as ``postgresql://user@host:port/db`` (its password
from ``PGPASSWORD`` or a ``PGPASSFILE``, which libpq reads, never from a file of ours)."""


class PrecursorSettings(BaseSettings):
    """Where a deployment keeps its local state. ``PRECURSOR_STATE_DIR`` moves all of it at once."""

    model_config = SettingsConfigDict(env_prefix="PRECURSOR_", extra="ignore")

    state_dir: Path = Path(".state")
    store: StoreLocation | None = Field(
        None, description="prediction store file or postgresql:// URL; default <state_dir>/store/predictions.duckdb"
    )
    store_url: StoreLocation | None = Field(
        None, description="the store on PostgreSQL (postgresql://user@host:port/db); wins over `store`"
    )

    @property
    def store_path(self) -> Path | str:
        return self.store_url or self.store or self.state_dir / "store" / "predictions.duckdb"
