"""HTTP authentication as a client sends it: the 401's challenge, the Bearer scheme in any case, the body's
hash on every view that authenticates, and the URL compared as it was requested (NIP-98's u tag)."""

from __future__ import annotations

from buzz.identity.communities import community_create, member_add
from buzz.identity.tokens import token_create
from buzz.nostr import Signer
from tests.http.http_support import request_sync
from tests.support.factories import nip98, nip98_url
from tests.support.relay import RelayFactory

HOST = "http-auth-fields.test"


def test_http_auth_as_clients_send_it(transactional_db: None, relay_factory: RelayFactory) -> None:
    w = Signer.generate()
    community = community_create(host=HOST, name="HTTP auth fields")
    member_add(community=community, pubkey=w.pubkey)
    token = token_create(community=community, pubkey=w.pubkey, scopes=["messages:read"]).token
    relay = relay_factory()

    def get(path: str, authorization: str | None = None, body: bytes = b"") -> tuple[int, dict[str, str]]:
        headers = {"Host": HOST}
        if authorization is not None:
            headers["Authorization"] = authorization
        answer = request_sync(relay, "GET", path, headers=headers, body=body)
        return answer.status, answer.headers

    # RFC 9110 section 15.5.2: a 401 names the schemes that would authenticate the request.
    for refused in (None, "Bearer buzz_unknown", "Nostr e30="):
        status, headers = get("/api/unread", refused)
        assert status == 401 and headers.get("www-authenticate") == "Nostr, Bearer", (refused, headers)
    # RFC 9110 section 11.1: the scheme is case-insensitive, for tokens as for NIP-98.
    for scheme in ("Bearer", "bearer", "BEARER"):
        assert get("/api/unread", f"{scheme} {token}")[0] == 200, scheme
    # The payload tag is checked against the body sent, on every view that authenticates: a GET with a body
    # signs its hash.
    body = b'{"note":"a body on a GET"}'
    for path in ("/api/unread", "/api/mentions"):
        assert get(path, nip98(w, HOST, "GET", path, body), body)[0] == 200, path
        assert get(path, nip98(w, HOST, "GET", path, b"other"), body)[0] == 401, path
    # NIP-98's u tag is the URL exactly as requested: characters a server would quote again, or an escape
    # it would decode, compare as sent.
    for target in ("/api/mentions?limit=5&x={a}", "/api/mentions?x=%7Ba%7D", "/api/%75nread"):
        assert get(target, nip98_url(w, f"http://{HOST}{target}", "GET"))[0] == 200, target
    # ... and only as sent: the decoded or re-quoted form of the same request is another URL.
    assert get("/api/mentions?x={a}", nip98_url(w, f"http://{HOST}/api/mentions?x=%7Ba%7D", "GET"))[0] == 401
    assert get("/api/%75nread", nip98_url(w, f"http://{HOST}/api/unread", "GET"))[0] == 401
