"""HTTP views. Thin: parse, call one service or selector, render."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_http_methods

from buzz.identity.communities import CommunityInfo
from buzz.web.nip11 import relay_document

NOSTR_JSON = "application/nostr+json"


def community_of(request: HttpRequest) -> CommunityInfo:
    community: CommunityInfo = request.scope["community"]  # type: ignore[attr-defined]
    return community


def _cors(response: HttpResponse) -> HttpResponse:
    # NIP-11: the document must be readable cross-origin.
    response["Access-Control-Allow-Origin"] = "*"
    response["Access-Control-Allow-Headers"] = "*"
    response["Access-Control-Allow-Methods"] = "GET, OPTIONS"
    response["Vary"] = "Accept"
    return response


@require_http_methods(["GET", "OPTIONS"])
def root(request: HttpRequest) -> HttpResponse:
    if request.method == "OPTIONS":
        # A browser's preflight for the NIP-11 document: the methods and headers it may use, nothing else.
        return _cors(HttpResponse(status=204))
    community = community_of(request)
    if NOSTR_JSON in request.headers.get("Accept", ""):
        response: HttpResponse = JsonResponse(relay_document(community), content_type=NOSTR_JSON)
        return _cors(response)
    response = render(request, "buzz/landing.html", {"community": community, "doc": relay_document(community)})
    response["Vary"] = "Accept"
    return response
