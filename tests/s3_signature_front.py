"""A front for the local S3 server that checks credentials the way S3 does, for the tests of refused credentials.

gofakes3 checks none, so a wrong secret key would go unnoticed against it. This front verifies each request's AWS
Signature Version 4 against one known key pair and answers as S3 does when it does not hold: ``403
InvalidAccessKeyId`` for a key id it does not know, ``403 SignatureDoesNotMatch`` for a signature the secret does not
make. A request that verifies is passed on to the server unchanged, so the clients see a real S3 exchange either way.
A key can be made a reader, whose policy allows reading objects but not listing: its listings get ``403 AccessDenied``.
A key can be made read-only, whose policy allows listing and reading but no write: its PUT, POST and DELETE requests
get ``403 AccessDenied``.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType

from infra.processes import free_ports

ALGORITHM = "AWS4-HMAC-SHA256"
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade"}


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def _canonical_query(query: str) -> str:
    pairs = []
    for item in query.split("&") if query else []:
        name, _, value = item.partition("=")
        pairs.append(
            (
                urllib.parse.quote(urllib.parse.unquote_plus(name), safe="-_.~"),
                urllib.parse.quote(urllib.parse.unquote_plus(value), safe="-_.~"),
            )
        )
    return "&".join(f"{n}={v}" for n, v in sorted(pairs))


def expected_signature(
    secret: str, method: str, target: str, headers: dict[str, str], signed: list[str], scope: str
) -> str:
    """The signature ``secret`` makes for this request: SigV4 as S3 computes it (the path is signed as sent)."""
    path, _, query = target.partition("?")
    canonical = "\n".join(
        [
            method,
            path or "/",
            _canonical_query(query),
            "".join(f"{name}:{' '.join(headers.get(name, '').split())}\n" for name in signed),
            ";".join(signed),
            headers.get("x-amz-content-sha256", "UNSIGNED-PAYLOAD"),
        ]
    )
    date, region, service, _ = scope.split("/")
    to_sign = "\n".join(
        [ALGORITHM, headers.get("x-amz-date", ""), scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    key = _hmac(_hmac(_hmac(_hmac(f"AWS4{secret}".encode(), date), region), service), "aws4_request")
    return hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()


def refusal(
    authorization: str,
    keys: dict[str, str],
    readers: frozenset[str],
    method: str,
    target: str,
    headers: dict[str, str],
    read_only: frozenset[str] = frozenset(),
) -> str:
    """The S3 error code for a request that none of ``keys`` (key id -> secret) signs, that a reader may not make (a
    listing) or that a read-only key may not make (a write); '' when it may go on."""
    if not authorization.startswith(ALGORITHM + " "):
        return "AccessDenied"
    fields = dict(part.strip().split("=", 1) for part in authorization[len(ALGORITHM) + 1 :].split(","))
    credential = fields.get("Credential", "")
    given_key, _, scope = credential.partition("/")
    if given_key not in keys:
        return "InvalidAccessKeyId"
    signed = fields.get("SignedHeaders", "").split(";")
    wanted = expected_signature(keys[given_key], method, target, headers, signed, scope)
    if not hmac.compare_digest(wanted, fields.get("Signature", "")):
        return "SignatureDoesNotMatch"
    path, _, query = target.partition("?")
    listing = method == "GET" and ("list-type=" in query or path.strip("/").count("/") == 0)
    writing = method in ("PUT", "POST", "DELETE")
    return "AccessDenied" if (given_key in readers and listing) or (given_key in read_only and writing) else ""


MESSAGES = {
    "AccessDenied": "Access Denied",
    "InvalidAccessKeyId": "The AWS Access Key Id you provided does not exist in our records.",
    "SignatureDoesNotMatch": "The request signature we calculated does not match the signature you provided. "
    "Check your key and signing method.",
}


class SignatureCheckingFront:
    """``127.0.0.1:port`` in front of the S3 server at ``upstream``; see the module text. A context manager."""

    def __init__(
        self,
        upstream_port: int,
        keys: dict[str, str],
        readers: frozenset[str] = frozenset(),
        read_only: frozenset[str] = frozenset(),
    ) -> None:
        self.port = free_ports(1)[0]
        front = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _handle(self) -> None:
                headers = {k.lower(): v for k, v in self.headers.items()}
                body = self.rfile.read(int(headers.get("content-length") or 0))
                code = refusal(
                    headers.get("authorization", ""), keys, readers, self.command, self.path, headers, read_only
                )
                if code:
                    self._answer(403, {"Content-Type": "application/xml"}, front.error_xml(code))
                    return
                upstream = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=30)
                try:
                    upstream.request(self.command, self.path, body=body, headers=dict(self.headers.items()))
                    response = upstream.getresponse()
                    answer = response.read()
                    passed = {k: v for k, v in response.getheaders() if k.lower() not in HOP_BY_HOP}
                finally:
                    upstream.close()
                self._answer(response.status, passed, answer)

            def _answer(self, status: int, headers: dict[str, str], body: bytes) -> None:
                self.send_response(status)
                for name, value in headers.items():
                    if name.lower() != "content-length":
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="s3-signature-front", daemon=True)

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @staticmethod
    def error_xml(code: str) -> bytes:
        return (
            f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
            f"<Message>{MESSAGES[code]}</Message><RequestId>front</RequestId></Error>"
        ).encode()

    def __enter__(self) -> SignatureCheckingFront:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
