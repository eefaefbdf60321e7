"""Who is calling the ingestion endpoint: a pod's projected ServiceAccount token, checked by the API server.

Input: a bearer token and the audience the pods' tokens are bound to. Output: a `PodCaller`
(namespace, pod name and uid, ServiceAccount) from a TokenReview the API server answered, or
`Unauthenticated` saying why the token is refused, or `ReviewUnavailable` when the API server did
not answer (the pod retries later). Only pod-bound tokens pass: a token that names no pod (a
legacy Secret token, a TokenRequest without a bound object) could speak for any job of its
namespace. Answers are cached by the token's SHA-256 for `ttl` seconds, so a pod's batches cost
one TokenReview a minute, not one each; refusals for `refusal_ttl` seconds (a client repeating a
bad token costs one review, and a token the API server has since revoked stays refused no longer).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
POD_NAME = "authentication.kubernetes.io/pod-name"
POD_UID = "authentication.kubernetes.io/pod-uid"

# (token, audiences) -> the TokenReview's status as a dict; raises when the API server fails.
ReviewCall = Callable[[str, list[str]], Mapping[str, Any]]


class Unauthenticated(Exception):  # noqa: N818 (a verdict, not a failure of ours)
    """The token is not a valid pod token for this audience; the message says why."""


class ReviewUnavailable(Exception):  # noqa: N818
    """The API server did not answer the TokenReview."""


@dataclass(frozen=True)
class PodCaller:
    """The pod a verified token belongs to."""

    namespace: str
    pod_name: str
    pod_uid: str
    service_account: str


def caller_of(status: Mapping[str, Any], audience: str) -> PodCaller:
    """The caller a TokenReview status vouches for; Unauthenticated when it vouches for none."""
    if status.get("authenticated") is not True:
        raise Unauthenticated(f"token not authenticated: {status.get('error') or 'no reason given'}")
    audiences = status.get("audiences") or []
    if audience not in audiences:
        raise Unauthenticated(f"token is not bound to audience {audience!r} (bound to {audiences})")
    user = status.get("user") or {}
    username = str(user.get("username") or "")
    if not username.startswith(SERVICE_ACCOUNT_PREFIX):
        raise Unauthenticated(f"{username!r} is not a ServiceAccount")
    namespace, _, account = username.removeprefix(SERVICE_ACCOUNT_PREFIX).partition(":")
    extra = user.get("extra") or {}
    pod_names, pod_uids = extra.get(POD_NAME) or [], extra.get(POD_UID) or []
    if not namespace or not account or len(pod_names) != 1 or len(pod_uids) != 1:
        raise Unauthenticated(f"token of {username!r} is not bound to one pod")
    return PodCaller(namespace, str(pod_names[0]), str(pod_uids[0]), account)


def api_review(api_client: Any, timeout: float) -> ReviewCall:
    """A ReviewCall through the kubernetes client: POST authentication.k8s.io/v1 tokenreviews."""
    from kubernetes import client

    api = client.AuthenticationV1Api(api_client)

    def review(token: str, audiences: list[str]) -> Mapping[str, Any]:
        body = client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token, audiences=audiences))
        try:
            answer = api.create_token_review(body, _request_timeout=timeout)
        except Exception as err:  # the client raises ApiException, urllib3 and socket errors alike
            raise ReviewUnavailable(f"TokenReview failed: {type(err).__name__}: {str(err)[:200]}") from None
        status = api_client.sanitize_for_serialization(answer).get("status") or {}
        return dict(status)

    return review


class TokenReviewer:
    """Verifies tokens with `review`, remembering each verified token for `ttl` seconds."""

    def __init__(
        self,
        review: ReviewCall,
        audience: str,
        *,
        ttl: float = 60.0,
        refusal_ttl: float = 10.0,
        max_entries: int = 4096,
    ) -> None:
        self._review, self.audience = review, audience
        self._ttl, self._refusal_ttl, self._max = ttl, refusal_ttl, max_entries
        self._known: OrderedDict[str, tuple[float, PodCaller]] = OrderedDict()
        self._refused: OrderedDict[str, tuple[float, str]] = OrderedDict()
        self._lock = threading.Lock()
        self.reviews = 0

    def verify(self, token: str) -> PodCaller:
        """The pod behind `token`; Unauthenticated or ReviewUnavailable otherwise."""
        if not token:
            raise Unauthenticated("no bearer token")
        digest = hashlib.sha256(token.encode()).hexdigest()
        with self._lock:
            now = time.monotonic()
            known = self._known.get(digest)
            if known is not None and now - known[0] < self._ttl:
                return known[1]
            refused = self._refused.get(digest)
            if refused is not None and now - refused[0] < self._refusal_ttl:
                raise Unauthenticated(refused[1])
        self.reviews += 1
        try:
            caller = caller_of(self._review(token, [self.audience]), self.audience)
        except Unauthenticated as err:
            with self._lock:
                _remember(self._refused, digest, (time.monotonic(), str(err)), self._max)
            raise
        with self._lock:
            _remember(self._known, digest, (time.monotonic(), caller), self._max)
        return caller

    def known(self, token: str) -> bool:
        """Whether `token` is answered from the cache (verified or refused) without a TokenReview."""
        digest = hashlib.sha256(token.encode()).hexdigest()
        now = time.monotonic()
        with self._lock:
            verified, refused = self._known.get(digest), self._refused.get(digest)
            return (verified is not None and now - verified[0] < self._ttl) or (
                refused is not None and now - refused[0] < self._refusal_ttl
            )


def _remember(cache: OrderedDict[str, tuple[float, Any]], digest: str, entry: tuple[float, Any], most: int) -> None:
    cache[digest] = entry
    cache.move_to_end(digest)
    while len(cache) > most:
        cache.popitem(last=False)
