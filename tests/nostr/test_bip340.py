"""BIP-340 verification and signing (buzz.nostr.bip340, buzz.nostr.keys) against the official vectors.

The vectors are read at test time from the shared CSV (the BIP's
test-vectors.csv); they are not copied into this repository. Set
BUZZ_VECTORS_DIR to read them from elsewhere.
"""

from __future__ import annotations

import csv
import hashlib
from dataclasses import dataclass

import pytest

from buzz.nostr import Signer, verify_schnorr
from tests.support.vectors import vectors_dir

VECTORS_DIR = vectors_dir()
CSV_PATH = VECTORS_DIR / "bip340-test-vectors.csv"


@dataclass(frozen=True)
class Vector:
    index: int
    secret: str
    pubkey: str
    aux: str
    message: str
    signature: str
    result: bool
    comment: str


def load_vectors() -> list[Vector]:
    with CSV_PATH.open(newline="") as f:
        rows = list(csv.DictReader(f))
    return [
        Vector(
            index=int(row["index"]),
            secret=row["secret key"],
            pubkey=row["public key"],
            aux=row["aux_rand"],
            message=row["message"],
            signature=row["signature"],
            result={"TRUE": True, "FALSE": False}[row["verification result"]],
            comment=row["comment"],
        )
        for row in rows
    ]


VECTORS = load_vectors()
SIGNING_VECTORS = [v for v in VECTORS if v.secret]


def test_vector_file_is_complete() -> None:
    # The 2022 revision of the file: 19 rows, 0..18, four with variable-length messages.
    assert [v.index for v in VECTORS] == list(range(19))
    assert {len(v.message) // 2 for v in VECTORS} >= {0, 1, 17, 32, 100}
    assert any(not v.result for v in VECTORS)


@pytest.mark.parametrize("v", VECTORS, ids=lambda v: f"vector{v.index}")
def test_verification_matches(v: Vector) -> None:
    msg = bytes.fromhex(v.message)
    assert verify_schnorr(v.pubkey.lower(), msg, v.signature.lower()) is v.result
    # Hex case is not part of the primitive's contract (parse_event enforces lowercase).
    assert verify_schnorr(v.pubkey, msg, v.signature) is v.result


@pytest.mark.parametrize("v", SIGNING_VECTORS, ids=lambda v: f"vector{v.index}")
def test_signing_reproduces_signature(v: Vector) -> None:
    msg = bytes.fromhex(v.message)
    aux = bytes.fromhex(v.aux)
    expected = v.signature.lower()
    # An independent, pure-Python BIP-340 signer agrees on every row...
    assert reference_sign(bytes.fromhex(v.secret), msg, aux).hex() == expected
    signer = Signer(v.secret.lower())
    assert signer.pubkey == v.pubkey.lower()
    if len(msg) == 32:
        # ...and so does Signer (libsecp256k1) on every 32-byte message.
        assert signer.sign_digest(msg, aux) == expected
    else:
        # Nostr only ever signs 32-byte ids; other lengths are refused, not truncated.
        with pytest.raises(ValueError, match="32 bytes"):
            signer.sign_digest(msg, aux)
    assert verify_schnorr(signer.pubkey, msg, expected)


@pytest.mark.parametrize("index", [5, 14])
def test_invalid_public_keys_return_false(index: int) -> None:
    v = VECTORS[index]
    assert not v.result
    assert verify_schnorr(v.pubkey.lower(), bytes.fromhex(v.message), v.signature.lower()) is False


GOOD = VECTORS[1]
GOOD_PK = GOOD.pubkey.lower()
GOOD_MSG = bytes.fromhex(GOOD.message)
GOOD_SIG = GOOD.signature.lower()


@pytest.mark.parametrize(
    ("pubkey", "msg", "sig"),
    [
        (GOOD_PK[:-2], GOOD_MSG, GOOD_SIG),
        (GOOD_PK + "00", GOOD_MSG, GOOD_SIG),
        (GOOD_PK[:-2] + "zz", GOOD_MSG, GOOD_SIG),
        (GOOD_PK[:2] + " " + GOOD_PK[3:], GOOD_MSG, GOOD_SIG),  # bytes.fromhex would skip the space
        ("", GOOD_MSG, GOOD_SIG),
        (None, GOOD_MSG, GOOD_SIG),
        (bytes.fromhex(GOOD_PK), GOOD_MSG, GOOD_SIG),
        (GOOD_PK, GOOD_MSG, GOOD_SIG[:-2]),
        (GOOD_PK, GOOD_MSG, GOOD_SIG + "00"),
        (GOOD_PK, GOOD_MSG, GOOD_SIG[:64] + " " + GOOD_SIG[65:]),
        (GOOD_PK, GOOD_MSG, None),
        (GOOD_PK, GOOD_MSG, bytes.fromhex(GOOD_SIG)),
        (GOOD_PK, GOOD.message, GOOD_SIG),
        (GOOD_PK, None, GOOD_SIG),
        (GOOD_PK, GOOD_MSG[:-1], GOOD_SIG),
    ],
)
def test_malformed_input_returns_false(pubkey: object, msg: object, sig: object) -> None:
    assert verify_schnorr(pubkey, msg, sig) is False  # type: ignore[arg-type]


def test_good_signature_sanity() -> None:
    assert verify_schnorr(GOOD_PK, GOOD_MSG, GOOD_SIG) is True


# ---------------------------------------------------------------- Signer


@pytest.mark.parametrize(
    "secret",
    [
        "00" * 32,  # zero
        "fffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141",  # the order n
        "ff" * 32,
        "01",
        "00" * 31 + "0g",
        " " + "00" * 31 + "1",
        "",
    ],
)
def test_signer_rejects_invalid_secrets(secret: str) -> None:
    with pytest.raises(ValueError, match="secret key"):
        Signer(secret)


def test_signer_generate_and_properties() -> None:
    a, b = Signer.generate(), Signer.generate()
    assert a.pubkey != b.pubkey
    assert len(a.pubkey) == 64 and a.pubkey == a.pubkey.lower()
    assert Signer(a.secret_hex).pubkey == a.pubkey
    assert a.secret_hex not in repr(a)
    assert a.pubkey in repr(a)


def test_sign_digest_fresh_aux_is_randomized_and_valid() -> None:
    signer = Signer.generate()
    msg = hashlib.sha256(b"x").digest()
    s1, s2 = signer.sign_digest(msg), signer.sign_digest(msg)
    assert s1 != s2
    assert verify_schnorr(signer.pubkey, msg, s1) and verify_schnorr(signer.pubkey, msg, s2)


def test_sign_digest_rejects_bad_lengths() -> None:
    signer = Signer.generate()
    with pytest.raises(ValueError, match="message must be 32 bytes"):
        signer.sign_digest(b"\x00" * 31)
    with pytest.raises(ValueError, match="aux must be 32 bytes"):
        signer.sign_digest(b"\x00" * 32, b"\x00" * 16)


# ---------------------------------------------------------------- reference signer
# Written from the BIP-340 specification's signing algorithm, in affine
# coordinates. Slow (milliseconds) and for tests only.

P = 2**256 - 2**32 - 977
N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
G = (
    0x79BE667EF9DCBBAC55A06295CE870B07029BFCDB2DCE28D959F2815B16F81798,
    0x483ADA7726A3C4655DA4FBFC0E1108A8FD17B448A68554199C47D08FFB10D4B8,
)
Point = tuple[int, int] | None


def point_add(a: Point, b: Point) -> Point:
    if a is None:
        return b
    if b is None:
        return a
    if a[0] == b[0] and (a[1] + b[1]) % P == 0:
        return None
    tangent = a == b
    rise, run = (3 * a[0] * a[0], 2 * a[1]) if tangent else (b[1] - a[1], b[0] - a[0])
    slope = rise * pow(run, -1, P) % P
    x = (slope * slope - a[0] - b[0]) % P
    return (x, (slope * (a[0] - x) - a[1]) % P)


def point_mul(k: int) -> tuple[int, int]:
    result: Point = None
    addend: Point = G
    while k:
        if k & 1:
            result = point_add(result, addend)
        addend = point_add(addend, addend)
        k >>= 1
    assert result is not None
    return result


def tagged_hash(tag: str, data: bytes) -> bytes:
    tag_hash = hashlib.sha256(tag.encode()).digest()
    return hashlib.sha256(tag_hash + tag_hash + data).digest()


def reference_sign(secret: bytes, msg: bytes, aux: bytes) -> bytes:
    d0 = int.from_bytes(secret, "big")
    assert 0 < d0 < N
    pub = point_mul(d0)
    d = d0 if pub[1] % 2 == 0 else N - d0
    px = pub[0].to_bytes(32, "big")
    t = (d ^ int.from_bytes(tagged_hash("BIP0340/aux", aux), "big")).to_bytes(32, "big")
    k0 = int.from_bytes(tagged_hash("BIP0340/nonce", t + px + msg), "big") % N
    assert k0 != 0
    r = point_mul(k0)
    k = k0 if r[1] % 2 == 0 else N - k0
    rx = r[0].to_bytes(32, "big")
    e = int.from_bytes(tagged_hash("BIP0340/challenge", rx + px + msg), "big") % N
    return rx + ((k + e * d) % N).to_bytes(32, "big")
