"""Secrets never leave the process: the one redaction of store URLs and password settings.

Every text that leaves the process and may hold a store URL goes through here: errors, log
lines, the MCP tools' answers, ``repr``. Three kinds of secret are masked as ``***``:

- the password in a URL's userinfo (``postgresql://user:PASSWORD@host/db``), found even when
  the URL is malformed (an unescaped ``@`` or ``%`` in the password, an unclosed ``[``, an
  unknown scheme such as ``postgresql+psycopg://``): everything between the userinfo's first
  ``:`` and the authority's last ``@`` is masked, which over-masks rather than leaks;
- ``password=`` (and ``sslpassword=``, ``PGPASSWORD=``) settings, in a query string, a libpq
  ``key=value`` string or an environment dump;
- the passwords of every store URL this process has opened (``remember_url``) and of
  ``AGENTMEND_STORE_URL`` and ``PGPASSWORD``, wherever they appear verbatim or percent-decoded:
  a driver's message may quote a fragment of the URL out of its context
  (``invalid percent-encoded token: "pw%ZZ"``).
"""

from __future__ import annotations

import os
import re
import threading
from functools import lru_cache
from urllib.parse import unquote

__all__ = ["MASK", "redact", "redact_url", "remember_url", "url_secrets"]

MASK = "***"

# shorter secrets are masked only where a pattern finds them: masking every "ab" in a message
# would make it unreadable and a password that short is no secret anyway
_MIN_SECRET_CHARS = 4

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
# a URL-looking token in free text: up to whitespace or a quote (a password holding either is
# still masked through the remembered secrets)
_URL_TOKEN = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]*")
_SETTING = re.compile(
    r"(?i)(?<![A-Za-z0-9_])((?:ssl)?password|pgpassword|passwd)(['\"]?\s*[=:]\s*)"
    r"('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^\s&;,'\"]*)"
)

_remembered: set[str] = set()
_remembered_lock = threading.Lock()


def redact_url(url: str) -> str:
    """``url`` with its password masked: in the userinfo and in ``password=`` parameters.

    Works on malformed URLs too (see the module's docstring); text that is no URL is returned
    with only its ``password=`` settings masked.
    """
    match = _SCHEME.match(url)
    if match is not None:
        start = match.end()
        at = url.rfind("@", start)
        colon = url.find(":", start)
        if at != -1 and -1 < colon < at and not url.startswith("/", start):
            url = f"{url[: colon + 1]}{MASK}{url[at:]}"
    return _SETTING.sub(_mask_setting, url)


@lru_cache(maxsize=64)
def url_secrets(url: str) -> frozenset[str]:
    """The secrets ``url`` holds, as given and percent-decoded (too-short ones left out)."""
    found: set[str] = set()
    match = _SCHEME.match(url)
    if match is not None and not url.startswith("/", match.end()):
        start = match.end()
        at = url.rfind("@", start)
        colon = url.find(":", start)
        if at != -1 and -1 < colon < at:
            password = url[colon + 1 : at]
            found.add(password)
            found.update(password.split("@"))  # a parser may split an unescaped "@" for us
    for setting in _SETTING.finditer(url):
        found.add(setting.group(3).strip("'\""))
    for secret in list(found):
        found.add(unquote(secret))
    return frozenset(s for s in found if len(s) >= _MIN_SECRET_CHARS)


def remember_url(url: str) -> None:
    """Mask ``url``'s secrets in every later ``redact`` of this process (a store opens it)."""
    secrets = url_secrets(url)
    if secrets - _remembered:
        with _remembered_lock:
            _remembered.update(secrets)


def redact(text: str) -> str:
    """``text`` with every store secret masked: URLs' passwords, ``password=`` settings, and
    the remembered and configured passwords wherever they appear."""
    secrets = set(_remembered)
    for name in ("AGENTMEND_STORE_URL", "PGPASSWORD"):
        value = os.environ.get(name)
        if value:
            secrets.update(url_secrets(value) if name == "AGENTMEND_STORE_URL" else (value,))
    for secret in sorted(secrets, key=len, reverse=True):  # longest first: no half-masked one
        if len(secret) >= _MIN_SECRET_CHARS:
            text = text.replace(secret, MASK)
    text = _URL_TOKEN.sub(lambda m: redact_url(m.group(0)), text)
    return _SETTING.sub(_mask_setting, text)


def _mask_setting(match: re.Match[str]) -> str:
    return f"{match.group(1)}{match.group(2)}{MASK}" if match.group(3) else match.group(0)
