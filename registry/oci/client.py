"""The OCI distribution API over httpx: authentication, TLS, retries, and faults named for people.

May touch one registry host over HTTPS (http:// only for hosts in PREBAKE_OCI_PLAIN_HTTP: never a
silent downgrade), the CAs of PREBAKE_OCI_CA_BUNDLE or /etc/docker/certs.d/<host>/ca.crt, and the
logins of registry/oci/auth.py. A 401 is answered once per challenge; a transient answer or a
dropped connection is retried as registry/shared/http.py says. What cannot succeed raises
RegistryUnavailable naming the registry and the fix; the caller turns a 404 into a miss.
Written over httpx rather than oras-py: oras-py's download has no digest check, size bound or
per-chunk hook, and its push builds its own manifest, so neither prebake's streamed verification
nor its deterministic manifest could go through it.
"""

from __future__ import annotations

import os
import re
import ssl
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from prebake.artifacts.ports.errors import RegistryError, RegistryUnavailable
from prebake.registry.oci.address import OCIAddress, OCISettings
from prebake.registry.oci.auth import Challenge, Login, config_locations, find_login, parse_challenge
from prebake.registry.shared.faults import Verdict, verdict
from prebake.registry.shared.http import TRANSIENT, causes, pause, retry_after_s

MAX_ANSWER_BYTES = 4 << 20  # a tags page, a token, any answer read whole (distribution's own manifest limit)
MAX_ERROR_BYTES = 64 << 10  # of an error body only this much is read: its code and message
CERTS_D = ("/etc/docker/certs.d", "/etc/containers/certs.d")


@dataclass
class _Auth:
    login: Login | None
    scheme: str = ""  # "", "basic" or "bearer": what the registry asked for
    challenge: Challenge | None = None
    tokens: dict[str, tuple[str, float]] = field(default_factory=dict)  # scope -> (token, expires at)
    refreshed: bool = False  # a refused token was replaced once already (an expired one gets one more)


class Distribution:
    """One repository of one registry, through a pooled httpx client."""

    def __init__(self, address: OCIAddress, settings: OCISettings, env: Mapping[str, str] = os.environ):
        self.address, self.settings = address, settings
        self.plain = address.host in settings.plain_http
        self.base = f"{'http' if self.plain else 'https'}://{address.host}"
        self._env = env
        self._auth: _Auth | None = None  # looked up on the first 401
        self._client = httpx.Client(
            verify=self._verify(),
            timeout=httpx.Timeout(settings.timeout_s),
            follow_redirects=True,  # blob GETs may go to storage; httpx drops Authorization off-origin
            limits=httpx.Limits(max_connections=max(settings.concurrency, settings.parts) + 4),
            trust_env=False,  # proxies from the environment are not for a registry on loopback
        )

    @property
    def url(self) -> str:
        return self.address.url

    def repo_path(self, rest: str) -> str:
        return f"{self.base}/v2/{self.address.repository}/{rest}"

    def request(
        self,
        method: str,
        url: str,
        *,
        push: bool = False,
        accept: str | None = None,
        headers: Mapping[str, str] | None = None,
        content: bytes | None = None,
        ok: tuple[int, ...] = (200, 201, 202, 204, 404),
    ) -> httpx.Response:
        """One request, read whole (at most MAX_ANSWER_BYTES: a longer answer is refused before it is read
        whole), authenticated and retried; a status outside `ok` raises."""
        with self.stream(method, url, push=push, accept=accept, headers=headers, content=content, ok=ok) as r:
            if read_at_most(r, MAX_ANSWER_BYTES):
                raise RegistryError(
                    f"{self.url}: the answer to {method} {_short_url(url)} is over {MAX_ANSWER_BYTES} bytes; no "
                    f"registry answer needs that: refusing it (is the address an OCI registry?)"
                )
            return r

    @contextmanager
    def stream(
        self,
        method: str,
        url: str,
        *,
        push: bool = False,
        accept: str | None = None,
        headers: Mapping[str, str] | None = None,
        content: Any = None,
        ok: tuple[int, ...] = (200, 201, 202, 204, 206, 404),
        retry: bool = True,
    ) -> Iterator[httpx.Response]:
        """The response of one request, its body not yet read (a blob streams from it)."""
        if not url.startswith("http"):
            url = self.repo_path(url)
        attempts = self.settings.max_attempts if retry else 1
        for attempt in range(attempts):
            last = attempt == attempts - 1
            send = dict(headers or {})
            if accept:
                send["Accept"] = accept
            authorised = self._authorization(push)
            if authorised:
                send["Authorization"] = authorised
            try:
                response = self._client.send(
                    self._client.build_request(method, url, headers=send, content=content), stream=True
                )
            except httpx.TransportError as exc:
                if last or not _retryable_transport(exc):
                    raise self.fault(exc, f"{method} {_short_url(url)}") from exc
                pause(attempt)
                continue
            try:
                if response.status_code == 401 and self._answer(response, push, had=bool(authorised)):
                    response.close()
                    continue
                if response.status_code != 401 and self._auth is not None:
                    self._auth.refreshed = False  # the token in use works: a later expiry may refresh again
                if response.status_code in TRANSIENT and not last:
                    asked = retry_after_s(response.headers.get("Retry-After", ""))
                    response.close()
                    pause(attempt, at_least=asked)
                    continue
                if response.status_code not in ok:
                    read_at_most(response, MAX_ERROR_BYTES)  # enough for its code and message, never more
                    raise self.refusal(response, f"{method} {_short_url(url)}")
                yield response
                return
            finally:
                response.close()
        raise RegistryUnavailable(f"{self.url}: no attempt was left for {method} {_short_url(url)}; retry later")

    def close(self) -> None:
        self._client.close()

    # -- authentication ---------------------------------------------------------------------

    def _authorization(self, push: bool) -> str | None:
        auth = self._auth
        if auth is None or not auth.scheme:
            return None
        if auth.scheme == "basic":
            return auth.login.basic() if auth.login else None
        got = auth.tokens.get(self._scope(push))
        if got is not None and got[1] > time.monotonic():
            return f"Bearer {got[0]}"
        return f"Bearer {self._token(push)}"

    def _answer(self, response: httpx.Response, push: bool, *, had: bool) -> bool:
        """Take up a 401's challenge; True when the request is worth sending again."""
        challenge = parse_challenge(response.headers.get("WWW-Authenticate", ""))
        if self._auth is None:
            self._auth = _Auth(find_login(self.address.host, self._env))
        auth = self._auth
        if challenge is None or challenge.scheme not in ("basic", "bearer"):
            return False
        if had and auth.scheme == challenge.scheme:
            if challenge.scheme == "bearer" and not auth.refreshed:
                auth.tokens.pop(self._scope(push), None)  # expired or revoked: one fresh token, once
                auth.refreshed = True
                return True
            return False  # the login was refused: refusal() explains
        auth.scheme, auth.challenge = challenge.scheme, challenge
        return challenge.scheme == "bearer" or auth.login is not None  # basic with no login: refusal() explains

    def _scope(self, push: bool) -> str:
        return f"repository:{self.address.repository}:{'pull,push' if push else 'pull'}"

    def _token(self, push: bool) -> str:
        """A bearer token for this repository from the challenge's realm (the distribution token spec)."""
        auth = self._auth
        assert auth is not None and auth.challenge is not None
        realm = auth.challenge.params.get("realm", "")
        if not realm.startswith(("https://", "http://")):
            raise RegistryUnavailable(f"{self.url} asked for a token from realm {realm!r}, which is not a URL")
        scope = self._scope(push)
        params = {"scope": scope, "service": auth.challenge.params.get("service", "")}
        login = auth.login
        try:
            if login is not None and login.identity_token:
                form = {
                    **params,
                    "grant_type": "refresh_token",
                    "refresh_token": login.password,
                    "client_id": "prebake",
                }
                asked = self._client.build_request("POST", realm, data=form)
            else:
                headers = {"Authorization": login.basic()} if login else {}
                asked = self._client.build_request(
                    "GET", realm, params={**params, "client_id": "prebake"}, headers=headers
                )
            r = self._client.send(asked, stream=True)
            try:
                too_long = read_at_most(r, MAX_ANSWER_BYTES)
            finally:
                r.close()
        except httpx.TransportError as exc:
            raise self.fault(exc, f"ask {realm} for a token") from exc
        if too_long:
            raise RegistryUnavailable(
                f"{self.url}: the token service {realm} answered over {MAX_ANSWER_BYTES} bytes; no token needs "
                f"that: refusing it (check the realm the registry names)"
            )
        if r.status_code in (401, 403):
            raise RegistryUnavailable(
                f"{self.url}: the token service {realm} refused {self._who()} (HTTP {r.status_code}); "
                f"log in again with `docker login {self.address.host}` or fix PREBAKE_OCI_USERNAME/PASSWORD"
            )
        if r.status_code != 200:
            raise RegistryUnavailable(
                f"{self.url}: the token service {realm} answered HTTP {r.status_code}; retry later"
            )
        try:
            body = r.json()
            token = str(body.get("token") or body["access_token"])
            expires = float(body.get("expires_in") or 60)
        except (ValueError, KeyError, TypeError, AttributeError):
            raise RegistryUnavailable(f"{self.url}: the token service {realm} answered no token") from None
        auth.tokens[scope] = (token, time.monotonic() + max(expires - 10, 1))
        return token

    def _who(self) -> str:
        login = self._auth.login if self._auth else None
        return f"the login from {login.source}" if login else "an anonymous request"

    # -- faults -------------------------------------------------------------------------------

    def fault(self, exc: Exception, doing: str) -> RegistryUnavailable:
        """A transport failure, named with the registry and what to check."""
        text = str(exc) or type(exc).__name__
        if isinstance(exc, httpx.TimeoutException):
            return RegistryUnavailable(
                f"cannot {doing} at {self.url}: the registry did not answer within {self.settings.timeout_s:g} s "
                f"({self.settings.max_attempts} attempts); check the network or the registry, or raise PREBAKE_OCI_TIMEOUT_S"
            )
        if _is_tls(exc):
            return RegistryUnavailable(
                f"cannot {doing} at {self.url}: TLS with {self.address.host} failed ({text[:200]}); if the registry uses "
                f"a private CA, set PREBAKE_OCI_CA_BUNDLE=/path/ca.pem or put it at "
                f"/etc/docker/certs.d/{self.address.host}/ca.crt; a registry without TLS must be named in PREBAKE_OCI_PLAIN_HTTP"
            )
        if self.plain and "Server disconnected" in text:
            return RegistryUnavailable(
                f"cannot {doing} at {self.url}: {self.address.host} dropped a plain-HTTP request ({text[:120]}); "
                f"if it speaks TLS, remove it from PREBAKE_OCI_PLAIN_HTTP"
            )
        return RegistryUnavailable(
            f"cannot {doing} at {self.url}: the registry did not answer ({text[:200]}); "
            f"check that it runs and that the address is right (PREBAKE_OCI_PLAIN_HTTP names a registry without "
            f"TLS; PREBAKE_OCI_TIMEOUT_S and _MAX_ATTEMPTS bound the wait), then retry"
        )

    def refusal(self, response: httpx.Response, doing: str) -> RegistryError:
        """An HTTP answer that is neither success nor a miss."""
        status = response.status_code
        detail = _error_detail(response)
        rule = verdict(status)
        if status == 401:
            login = self._auth.login if self._auth else None
            if login is None:
                return RegistryUnavailable(
                    f"cannot {doing} at {self.url}: the registry wants a login and none was found "
                    f"(looked in {config_locations(self._env)}); run `docker login {self.address.host}` "
                    f"or set PREBAKE_OCI_USERNAME and PREBAKE_OCI_PASSWORD"
                )
            return RegistryUnavailable(
                f"cannot {doing} at {self.url}: the registry refused the login from {login.source} ({detail}); "
                f"the password or token is wrong or expired: run `docker login {self.address.host}` again"
            )
        if rule is Verdict.REFUSED:
            return RegistryUnavailable(
                f"cannot {doing} at {self.url}: {self._who()} may not do that ({detail}); "
                f"ask for pull (and, to publish, push) access to {self.address.repository}"
            )
        if rule is Verdict.RETRY_LATER:
            return RegistryUnavailable(
                f"cannot {doing} at {self.url}: HTTP {status} ({detail}) after {self.settings.max_attempts} attempts; retry later"
            )
        if status == 400 and self.plain and "HTTPS" in response.text:
            return RegistryUnavailable(
                f"cannot {doing} at {self.url}: {self.address.host} speaks TLS, but it is named in "
                f"PREBAKE_OCI_PLAIN_HTTP; remove it from there (and give its CA with PREBAKE_OCI_CA_BUNDLE)"
            )
        if status == 405 and "DELETE" in doing:
            return RegistryError(
                f"cannot {doing} at {self.url}: the registry does not allow deletes ({detail}); enable them "
                f"(distribution: storage.delete.enabled: true) or remove the entry with the registry's own tools"
            )
        return RegistryError(f"cannot {doing} at {self.url}: HTTP {status} ({detail})")

    def _verify(self) -> ssl.SSLContext | bool:
        if self.plain:
            return False
        extra = self.settings.ca_bundle or next(
            (str(p) for d in CERTS_D if (p := Path(d, self.address.host, "ca.crt")).is_file()), ""
        )
        context = ssl.create_default_context()
        if extra:
            try:
                context.load_verify_locations(cafile=extra)
            except (OSError, ssl.SSLError) as exc:
                raise RegistryError(f"cannot load the CA bundle {extra}: {exc}; point it at a PEM file of CAs") from exc
        return context


def _retryable_transport(exc: httpx.TransportError) -> bool:
    return not _is_tls(exc) and not isinstance(exc, httpx.UnsupportedProtocol)


def _is_tls(exc: BaseException) -> bool:
    tls = (
        isinstance(s, ssl.SSLError) or "CERTIFICATE_VERIFY_FAILED" in str(s) or "SSL" in type(s).__name__
        for s in causes(exc)
    )
    return any(tls) or "[SSL" in str(exc)


def read_at_most(response: httpx.Response, limit: int) -> bool:
    """Read at most `limit` bytes of a streamed body (none when Content-Length says more) and keep them as
    the response's content (.content, .text and .json() read them); True if the body was longer."""
    declared = response.headers.get("Content-Length", "")
    chunks: list[bytes] = []
    longer = declared.isdigit() and int(declared) > limit
    total = 0
    if not longer:
        for chunk in response.iter_bytes(64 << 10):
            total += len(chunk)
            if total > limit:
                longer = True
                break
            chunks.append(chunk)
    response._content = b"".join(chunks)  # where httpx's own read() keeps a body
    return longer


def _error_detail(response: httpx.Response) -> str:
    """The distribution error's code and message, or the status line."""
    try:
        errors = response.json().get("errors") or []
        if errors:
            first = errors[0]
            return f"{first.get('code', '')}: {str(first.get('message', ''))[:160]}"
    except (ValueError, AttributeError, httpx.ResponseNotRead):
        pass
    return f"HTTP {response.status_code} {response.reason_phrase}"


def _short_url(url: str) -> str:
    return re.sub(r"^https?://[^/]+", "", url).split("?", 1)[0][:160]
