"""NIP-OA owner attestations (buzz.nostr.nipoa) against the spec's vectors.

The vectors are read at test time from the shared nip-oa.json (set
BUZZ_VECTORS_DIR to read them from elsewhere). Each must_reject description
is turned into a concrete event: re-signed by the agent, so that the one
defect named is the only thing wrong with it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from buzz.nostr import (
    Event,
    OwnerAttestation,
    ProtocolError,
    Signer,
    attestation_digest,
    make_auth_tag,
    parse_and_verify,
    parse_conditions,
    parse_event,
    verify_owner_attestation,
    verify_schnorr,
)
from tests.support.vectors import vectors_dir

VECTORS_DIR = vectors_dir()
V: dict[str, Any] = json.loads((VECTORS_DIR / "nip-oa.json").read_text())
OWNER = Signer(V["owner_secret"])
AGENT = Signer(V["agent_secret"])
TAG: list[str] = V["tag"]
SIGNED = V["signed_event"]


def agent_event(
    tags: Sequence[Sequence[str]],
    *,
    kind: int = SIGNED["kind"],
    created_at: int = SIGNED["created_at"],
    signer: Signer = AGENT,
) -> Event:
    return signer.sign_event(kind=kind, tags=tags, content=SIGNED["content"], created_at=created_at)


def owner_tag(conditions: str, *, owner: Signer = OWNER, agent: str = AGENT.pubkey) -> list[str]:
    # Signed directly, bypassing make_auth_tag's grammar check: the signature
    # is genuine, so only the verifier's rules can refuse the tag.
    return ["auth", owner.pubkey, conditions, owner.sign_digest(attestation_digest(agent, conditions))]


def rejection(ev: Event) -> str:
    with pytest.raises(ProtocolError) as info:
        verify_owner_attestation(ev)
    assert info.value.reason.startswith("invalid: ")
    return info.value.reason


# ---------------------------------------------------------------- the valid vector


def test_vector_keys() -> None:
    assert OWNER.pubkey == V["owner_pubkey"]
    assert AGENT.pubkey == V["agent_pubkey"]


def test_vector_preimage_and_digest() -> None:
    preimage = f"nostr:agent-auth:{V['agent_pubkey']}:{V['conditions']}"
    assert preimage == V["preimage"]
    assert hashlib.sha256(preimage.encode()).hexdigest() == V["preimage_sha256"]
    assert attestation_digest(V["agent_pubkey"], V["conditions"]).hex() == V["preimage_sha256"]


def test_vector_auth_sig_verifies() -> None:
    digest = bytes.fromhex(V["preimage_sha256"])
    assert verify_schnorr(V["owner_pubkey"], digest, V["auth_sig"])
    assert V["tag"] == ["auth", V["owner_pubkey"], V["conditions"], V["auth_sig"]]


def test_vector_signed_event_verifies_and_attests() -> None:
    ev = parse_and_verify(SIGNED)
    assert list(ev.tags[0]) == TAG
    assert verify_owner_attestation(ev) == OwnerAttestation(owner=V["owner_pubkey"], conditions=V["conditions"])


def test_make_auth_tag_verifies() -> None:
    tag = make_auth_tag(OWNER, AGENT.pubkey, V["conditions"])
    assert tag[:3] == tuple(TAG[:3])
    ev = agent_event([tag])
    assert verify_owner_attestation(ev) == OwnerAttestation(OWNER.pubkey, V["conditions"])


def test_make_auth_tag_refuses_bad_input() -> None:
    with pytest.raises(ProtocolError, match="malformed"):
        make_auth_tag(OWNER, AGENT.pubkey, "kind=1&")
    with pytest.raises(ProtocolError, match="must not be the event pubkey"):
        make_auth_tag(OWNER, OWNER.pubkey, "")


def test_no_auth_tag_is_none() -> None:
    assert verify_owner_attestation(agent_event([["p", OWNER.pubkey]])) is None
    # The name must match exactly.
    assert verify_owner_attestation(agent_event([["Auth", *TAG[1:]]])) is None


def test_auth_tag_among_other_tags() -> None:
    ev = agent_event([["h", "x"], TAG, ["t", "y"]])
    assert verify_owner_attestation(ev) == OwnerAttestation(OWNER.pubkey, V["conditions"])


# ---------------------------------------------------------------- must_reject


def two_auth_tags() -> list[Event]:
    return [agent_event([TAG, TAG]), agent_event([TAG, owner_tag("kind=1")])]


def wrong_element_count() -> list[Event]:
    return [
        agent_event([TAG[:3]]),
        agent_event([TAG[:2]]),
        agent_event([["auth"]]),
        agent_event([[*TAG, "extra"]]),
    ]


def trailing_delimiter() -> list[Event]:
    return [agent_event([owner_tag("kind=1&")])]


def leading_zero() -> list[Event]:
    return [agent_event([owner_tag("kind=01")])]


def self_attestation() -> list[Event]:
    return [agent_event([owner_tag("kind=1", owner=AGENT)])]


def invalid_id_or_sig() -> list[Event]:
    good = dict(SIGNED)
    bad_sig = SIGNED["sig"][:-1] + ("0" if SIGNED["sig"][-1] != "0" else "1")
    return [
        parse_event({**good, "sig": bad_sig}),
        parse_event({**good, "content": "tampered content"}),
        parse_event({**good, "created_at": good["created_at"] + 1}),
        parse_event({**good, "id": "00" * 32}),
    ]


MUST_REJECT: dict[str, Callable[[], list[Event]]] = {
    "two auth tags on one event": two_auth_tags,
    "auth tag with fewer or more than four elements": wrong_element_count,
    "conditions 'kind=1&' (trailing delimiter)": trailing_delimiter,
    "conditions 'kind=01' (leading zero)": leading_zero,
    "owner pubkey equal to event pubkey (self-attestation)": self_attestation,
    "well-formed auth tag on an event whose id or sig is invalid": invalid_id_or_sig,
}


def test_every_must_reject_case_has_a_builder() -> None:
    assert set(V["must_reject"]) == set(MUST_REJECT)


@pytest.mark.parametrize("case", V["must_reject"])
def test_must_reject(case: str) -> None:
    events = MUST_REJECT[case]()
    assert events
    for ev in events:
        rejection(ev)


def test_must_reject_reasons_are_specific() -> None:
    assert rejection(two_auth_tags()[0]) == "invalid: event has more than one auth tag"
    for ev in wrong_element_count():
        assert rejection(ev) == "invalid: auth tag must have exactly 4 elements"
    assert rejection(trailing_delimiter()[0]) == "invalid: auth tag conditions are malformed"
    assert rejection(leading_zero()[0]) == "invalid: auth tag conditions are malformed"
    assert rejection(self_attestation()[0]) == "invalid: auth tag owner must not be the event pubkey"
    bad_sig, *mismatched = invalid_id_or_sig()
    assert rejection(bad_sig) == "invalid: bad signature"
    for ev in mismatched:
        assert rejection(ev) == "invalid: event id does not match its content"


def test_the_defect_is_the_only_problem() -> None:
    # The mutated events above are otherwise valid Nostr events.
    for build in (two_auth_tags, wrong_element_count, trailing_delimiter, leading_zero):
        for ev in build():
            parse_and_verify(ev.to_dict())


# ---------------------------------------------------------------- further rules


@pytest.mark.parametrize(
    "conditions",
    [
        "&kind=1",
        "kind=1&&created_at<5",
        "&",
        "kind=1 ",
        " kind=1",
        "kind = 1",
        "Kind=1",
        "KIND=1",
        "kind==1",
        "kind>1",
        "created_at=5",
        "created_at<=5",
        "pubkey=ab",
        "kind=",
        "kind=+1",
        "kind=-1",
        "kind=1.0",
        "kind=0x1",
        "kind=\u0661",  # ARABIC-INDIC DIGIT ONE: a digit to \d, not to NIP-OA
        "kind=65536",
        "kind=99999999999999999999",
        "created_at<4294967296",
        "created_at>00",
        "created_at<01",
        "kind=1\n",
    ],
)
def test_condition_grammar_rejections(conditions: str) -> None:
    with pytest.raises(ProtocolError, match=r"^invalid: auth tag condition"):
        parse_conditions(conditions)
    rejection(agent_event([owner_tag(conditions)], kind=1, created_at=10))


@pytest.mark.parametrize(
    ("conditions", "clauses"),
    [
        ("", []),
        ("kind=0", [("kind=", 0)]),
        ("kind=65535", [("kind=", 65535)]),
        ("created_at<4294967295", [("created_at<", 4294967295)]),
        ("created_at>0", [("created_at>", 0)]),
        ("kind=1&kind=1", [("kind=", 1), ("kind=", 1)]),
        (
            "created_at>5&kind=7&created_at<20",
            [("created_at>", 5), ("kind=", 7), ("created_at<", 20)],
        ),
    ],
)
def test_condition_grammar_accepts(conditions: str, clauses: list[tuple[str, int]]) -> None:
    assert parse_conditions(conditions) == clauses


def test_empty_conditions_impose_nothing() -> None:
    ev = agent_event([owner_tag("")], kind=30023, created_at=1)
    assert verify_owner_attestation(ev) == OwnerAttestation(OWNER.pubkey, "")


@pytest.mark.parametrize(
    ("conditions", "kind", "created_at", "ok"),
    [
        ("kind=1", 1, 100, True),
        ("kind=1", 7, 100, False),
        ("created_at<100", 1, 99, True),
        ("created_at<100", 1, 100, False),
        ("created_at>100", 1, 101, True),
        ("created_at>100", 1, 100, False),
        ("kind=1&kind=7", 1, 100, False),  # every clause is evaluated
        ("created_at>10&created_at<20", 1, 15, True),
        ("created_at>10&created_at<20", 1, 20, False),
        ("created_at>10&created_at<20", 1, 10, False),
    ],
)
def test_conditions_are_judged_against_the_event(conditions: str, kind: int, created_at: int, ok: bool) -> None:
    ev = agent_event([owner_tag(conditions)], kind=kind, created_at=created_at)
    if ok:
        assert verify_owner_attestation(ev) == OwnerAttestation(OWNER.pubkey, conditions)
    else:
        assert rejection(ev).startswith("invalid: event does not satisfy auth condition ")


def test_vector_tag_on_an_event_outside_its_conditions() -> None:
    assert rejection(agent_event([TAG], kind=7)) == "invalid: event does not satisfy auth condition kind=1"
    assert rejection(agent_event([TAG], created_at=1713957000)) == (
        "invalid: event does not satisfy auth condition created_at<1713957000"
    )


def test_vector_tag_for_another_agent() -> None:
    other = Signer.generate()
    ev = agent_event([TAG], signer=other)
    assert rejection(ev) == "invalid: auth tag signature does not verify"


def test_reordered_conditions_break_the_signature() -> None:
    tag = [TAG[0], TAG[1], "created_at<1713957000&kind=1", TAG[3]]
    assert rejection(agent_event([tag])) == "invalid: auth tag signature does not verify"


def test_signature_by_another_owner() -> None:
    impostor = Signer.generate()
    genuine = owner_tag("kind=1", owner=impostor)
    tag = ["auth", OWNER.pubkey, "kind=1", genuine[3]]
    assert rejection(agent_event([tag])) == "invalid: auth tag signature does not verify"


@pytest.mark.parametrize(
    ("owner", "reason"),
    [
        (V["owner_pubkey"].upper(), "invalid: auth tag owner must be 64 lowercase hex characters"),
        (V["owner_pubkey"][:-2], "invalid: auth tag owner must be 64 lowercase hex characters"),
        ("", "invalid: auth tag owner must be 64 lowercase hex characters"),
        (
            "eefdea4cdb677750a420fee807eacf21eb9898ae79b9768766e4faa04a2d4a34",
            "invalid: auth tag owner is not a valid public key",
        ),
        ("ff" * 32, "invalid: auth tag owner is not a valid public key"),
    ],
)
def test_bad_owner_pubkey(owner: str, reason: str) -> None:
    assert rejection(agent_event([["auth", owner, TAG[2], TAG[3]]])) == reason


@pytest.mark.parametrize("sig", [TAG[3].upper(), TAG[3][:-2], "", "zz" * 64])
def test_bad_sig_encoding(sig: str) -> None:
    assert rejection(agent_event([["auth", TAG[1], TAG[2], sig]])) == (
        "invalid: auth tag signature must be 128 lowercase hex characters"
    )
