"""Certificate authorities made on the spot, for the tests that run brokers with TLS.

A test makes its own CA and signs a server certificate for 127.0.0.1 and localhost with it; another CA of the same
shape is the impostor a client must refuse. Keys are EC P-256 and written as unencrypted PKCS#8 PEM, the form both
Kafka's PEM key store and Mosquitto read.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Issued:
    cert_file: Path
    key_file: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    path.chmod(0o600)


class TestCA:
    """A self-signed CA in ``directory``; :meth:`issue` signs leaf certificates with it."""

    __test__ = False  # a helper, not a test class

    def __init__(self, directory: Path, name: str = "precursor-test-ca") -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.now(UTC)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(_name(name))
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5))
            .not_valid_after(now + timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        self.cert_file = directory / f"{name}.pem"
        self.cert_file.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, common_name: str, *, hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> Issued:
        """A certificate for ``hosts`` usable by a server and a client alike (a broker is both to its controller)."""
        key = ec.generate_private_key(ec.SECP256R1())
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        now = datetime.now(UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5))
            .not_valid_after(now + timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
            .sign(self._key, hashes.SHA256())
        )
        issued = Issued(self.directory / f"{common_name}.pem", self.directory / f"{common_name}.key")
        issued.cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, issued.key_file)
        return issued
