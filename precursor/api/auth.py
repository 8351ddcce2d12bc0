"""Bearer-token authentication: no token, no data.

Every token is compared in constant time (``hmac.compare_digest``) against every accepted token, so the time taken
says nothing about how much of a guess was right, nor which token matched. A token is never logged or echoed.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

bearer = HTTPBearer(auto_error=False, description="an API token from PRECURSOR_API_TOKENS or the token file")

CHALLENGE = {"WWW-Authenticate": 'Bearer realm="precursor"'}


class TokenChecker:
    """Holds the accepted tokens; ``check`` says whether a presented one is among them."""

    def __init__(self, tokens: list[bytes]) -> None:
        if not tokens:
            raise ValueError("no API tokens configured: set PRECURSOR_API_TOKENS or PRECURSOR_API_TOKEN_FILE")
        self._tokens = list(tokens)

    def check(self, presented: str) -> bool:
        candidate = presented.encode()
        matched = False
        for token in self._tokens:  # every token, always: no early exit that a timer could see
            matched |= hmac.compare_digest(candidate, token)
        return matched


def require_token(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> None:
    """The dependency every data endpoint has: 401 without a valid ``Authorization: Bearer <token>``."""
    if credentials is None or credentials.scheme.lower() != "bearer" or not credentials.credentials:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "missing bearer token: send the header 'Authorization: Bearer <token>'",
            headers=CHALLENGE,
        )
    checker: TokenChecker = request.app.state.tokens
    if not checker.check(credentials.credentials):
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "the bearer token is not valid", headers=CHALLENGE)


Authenticated = Depends(require_token)
