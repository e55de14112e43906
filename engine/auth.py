"""The shared token between engine workers and whoever calls them (router, fleet, Leap).

Workers listen on the network once they serve other hosts, so every request carries
`Authorization: Bearer <token>` and a worker answers 401 to any request without the right one.
Only `GET /health` stays open, for readiness probes (a Kubernetes probe carries no secret); without
the token it says `ok` and nothing else. The token is compared in constant time.
"""

from __future__ import annotations

import hmac
import json

OPEN_PATHS = frozenset({"/health"})


class MissingToken(ValueError):
    """A worker was asked to serve, or a client to call, with an empty token."""


def auth_headers(token: str) -> dict[str, str]:
    """The header every request to a worker carries."""
    if not token:
        raise MissingToken("engine workers need a non-empty shared token")
    return {"authorization": f"Bearer {token}"}


def token_matches(header: bytes | None, token: str) -> bool:
    """Whether an `Authorization` header value carries `token`, compared in constant time."""
    if header is None:
        return False
    scheme, _, presented = header.partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(presented.strip(), token.encode())


class TokenAuth:
    """ASGI middleware: refuse (401) every HTTP request without the token but those to `OPEN_PATHS`.

    It records the outcome in the request's state (`authenticated`), so an open path can tell
    an authenticated caller from a probe and show it more.
    """

    def __init__(self, app, token: str):
        auth_headers(token)
        self.app = app
        self.token = token

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header = dict(scope.get("headers") or []).get(b"authorization")
        authenticated = token_matches(header, self.token)
        scope.setdefault("state", {})["authenticated"] = authenticated
        if authenticated or scope.get("path") in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        body = json.dumps({"detail": "missing or wrong worker token"}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b"Bearer"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
