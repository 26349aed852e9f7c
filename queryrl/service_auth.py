"""Bearer tokens for queryrl's own services (``serve-rag``, ``serve-judge``) and their clients.

A service bound to a loopback address (``127.0.0.1``, any ``127.x``, ``::1``, ``localhost``) is
reachable from this machine only and may run open. Bound to any other address it must have a
token: :func:`check_bind` refuses to start it otherwise. With a token, every route but
``GET /health`` (status only, no data) wants ``Authorization: Bearer <token>`` and answers 401
otherwise; the comparison is constant-time (:func:`bearer_matches`). Tokens are registered with
:mod:`queryrl.redaction`, so their values never reach a log line or the console.
"""

from __future__ import annotations

import hmac
import ipaddress
import os

from queryrl.redaction import add_secret

MIN_TOKEN_CHARS = 16
LOOPBACK_NAMES = ("localhost",)
TOKEN_HELP = (
    "give one with --token-env VAR (an environment variable holding it, e.g. "
    "export VAR=\"$(python -c 'import secrets; print(secrets.token_urlsafe(32))')\"); "
    "--token VALUE works too but shows the token to every user of this machine in `ps`"
)


class TokenError(ValueError):
    """A token that is missing, unset or too weak for the address a service binds."""


def is_loopback(host: str) -> bool:
    """Whether `host` is reachable from this machine only (127.0.0.0/8, ::1, localhost)."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name other than localhost: it may resolve to any interface
        return False


def resolve_token(token: str | None, token_env: str | None, service: str) -> str | None:
    """The token from `token` or the variable `token_env` (not both), registered for redaction; None if neither.

    Raises:
        TokenError: both given, or `token_env` is not set / empty.
    """
    if token and token_env:
        raise TokenError(f"{service}: give --token-env or --token, not both")
    if token_env:
        token = os.environ.get(token_env)
        if not token:
            raise TokenError(f"{service}: environment variable {token_env} is not set or empty")
    if token:
        add_secret(token)
    return token or None


def check_bind(host: str, token: str | None, service: str) -> None:
    """Refuse to serve on a non-loopback `host` without a token of at least :data:`MIN_TOKEN_CHARS` characters.

    Raises:
        TokenError: the one-line reason and the way out.
    """
    if is_loopback(host):
        return
    if token is None:
        raise TokenError(
            f"{service}: binding {host} (not a loopback address) needs a token that clients send as "
            f"'Authorization: Bearer <token>'; {TOKEN_HELP}; or bind 127.0.0.1 (this machine only)"
        )
    if len(token) < MIN_TOKEN_CHARS:
        raise TokenError(f"{service}: the token is {len(token)} characters; use at least {MIN_TOKEN_CHARS}")


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (the scheme in any case, RFC 7235); None for a
    missing header, another scheme or a bare token without ``Bearer``."""
    scheme, _, given = (authorization or "").strip().partition(" ")
    return given.strip() or None if scheme.lower() == "bearer" else None


def bearer_matches(authorization: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header carries `token` as a bearer token (constant-time compare); a bare
    token without ``Bearer`` does not."""
    given = bearer_token(authorization)
    return given is not None and hmac.compare_digest(given.encode(), token.encode())


def bearer_header(token_env: str | None, what: str) -> dict[str, str]:
    """``{"Authorization": "Bearer <value of token_env>"}`` for a client (empty without `token_env`).

    Raises:
        TokenError: `token_env` names a variable that is not set or empty (`what` names the config key).
    """
    if not token_env:
        return {}
    token = os.environ.get(token_env)
    if not token:
        raise TokenError(f"{what}: environment variable {token_env} is not set or empty")
    add_secret(token)
    return {"Authorization": f"Bearer {token}"}
