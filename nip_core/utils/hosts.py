"""Whether a host or a URL stays on this machine (loopback)."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit


def is_loopback_host(host: str | None) -> bool:
    """``localhost``, ``127.0.0.0/8`` or ``::1`` (a wildcard such as ``0.0.0.0`` is not)."""
    if not host:
        return False
    host = host.strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_loopback_url(url: str) -> bool:
    """Whether ``url``'s host is a loopback host (:func:`is_loopback_host`)."""
    try:
        return is_loopback_host(urlsplit(url).hostname)
    except ValueError:
        return False
