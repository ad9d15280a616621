"""Bearer-token check of ``kvcli serve``: constant-time, OpenAI's 401 body, loopback-only without a key."""

from __future__ import annotations

import hmac
import ipaddress

from kvcli.server.objects import error_body


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve anywhere


class BearerAuth:
    def __init__(self, api_key: str | None) -> None:
        self._key = api_key.encode() if api_key else None

    def check(self, authorization: str | None) -> dict[str, object] | None:
        """None when the request may go on; else OpenAI's 401 error body."""
        if self._key is None:
            return None
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            return error_body("You didn't provide an API key. You need to provide your API key "
                              "in an Authorization header using Bearer auth (i.e. "
                              "Authorization: Bearer YOUR_KEY).", code=None)
        # compare_digest's time depends on the lengths only, never on where they differ.
        if not hmac.compare_digest(token.strip().encode(), self._key):
            return error_body("Incorrect API key provided.", code="invalid_api_key")
        return None
