"""The published vectors of the client (artifacts/client/vectors/): nip-ar-set-v1 digests and derived d.

Each vector is checked against the client and checked for consistency in itself (the
preimage it shows hashes to its digest), so the files are usable by other implementations.
derive_d is also checked on arbitrary strings, non-ASCII ones included, against a second
implementation of RFC 9562's version and variant bits written with integers.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import artifacts.client
from artifacts.client import derive_d, set_digest
from artifacts.client.identity import derive_preimage

VECTORS = Path(artifacts.client.__file__).parent / "vectors"
DIGESTS = json.loads((VECTORS / "set_digest.json").read_text(encoding="utf-8"))
DERIVED = json.loads((VECTORS / "derive_d.json").read_text(encoding="utf-8"))
UUID_V8 = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")
scalar_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=60)


def pairs(vector: dict[str, Any]) -> list[tuple[str, str]]:
    return [(h["d"], h["id"]) for h in vector["heads"]]


@pytest.mark.parametrize("vector", DIGESTS["valid"], ids=lambda v: v["name"])
def test_digest_vector(vector: dict[str, Any]) -> None:
    assert set_digest(pairs(vector)) == vector["digest"]
    assert set_digest(dict(pairs(vector))) == vector["digest"]
    # The vector is self-consistent: its preimage is the spec's bytes, and hashes to its digest.
    preimage = vector["preimage"].encode("utf-8")
    assert hashlib.sha256(preimage).hexdigest() == vector["digest"]
    assert preimage.startswith(b"nip-ar-set-v1\x00")
    lines = preimage.removeprefix(b"nip-ar-set-v1\x00").decode().splitlines()
    assert lines == [f"{d}:{i}" for d, i in sorted(pairs(vector))]


def test_digest_vectors_cover_the_cases_the_spec_names() -> None:
    by_name = {v["name"]: v for v in DIGESTS["valid"]}
    assert by_name["empty set"]["digest"] == hashlib.sha256(b"nip-ar-set-v1\x00").hexdigest()
    given_orders = [v for v in DIGESTS["valid"] if "same three" in v["name"]]
    sorted_three = by_name["three artifacts, given sorted"]
    assert len(given_orders) == 2 and all(v["digest"] == sorted_three["digest"] for v in given_orders)
    assert by_name["one head changed: another digest"]["digest"] != sorted_three["digest"]
    assert len({v["digest"] for v in DIGESTS["valid"]}) == len(DIGESTS["valid"]) - 2


@pytest.mark.parametrize("vector", DIGESTS["invalid"], ids=lambda v: v["name"])
def test_digest_refuses_what_would_be_ambiguous(vector: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=re.escape(vector["error"])):
        set_digest(pairs(vector))


@given(
    st.lists(st.tuples(st.uuids(), st.binary(min_size=32, max_size=32)), unique_by=lambda p: p[0], max_size=20),
    st.randoms(),
)
def test_digest_is_independent_of_order(items: list[tuple[uuid.UUID, bytes]], rnd: random.Random) -> None:
    heads = [(str(d), b.hex()) for d, b in items]
    shuffled = heads[:]
    rnd.shuffle(shuffled)
    assert set_digest(heads) == set_digest(shuffled) == set_digest(dict(shuffled))
    if heads:
        changed = [(heads[0][0], hashlib.sha256(heads[0][1].encode()).hexdigest()), *heads[1:]]
        assert set_digest(changed) != set_digest(heads)


@pytest.mark.parametrize("vector", DERIVED["vectors"], ids=lambda v: v["name"])
def test_derive_d_vector(vector: dict[str, Any]) -> None:
    h, type_name, key = vector["h"], vector["type"], vector["key"]
    assert derive_d(h, type_name, key) == vector["d"]
    preimage = derive_preimage(h, type_name, key)
    assert preimage.hex() == vector["preimage_hex"]
    # The spec's preimage: "nip-ar-artifact\0" + h + "\0" + type + "\0" + key, each as UTF-8.
    assert preimage == b"\0".join([b"nip-ar-artifact", h.encode(), type_name.encode(), key.encode()])
    assert hashlib.sha256(preimage).hexdigest() == vector["sha256"]
    d = uuid.UUID(vector["d"])
    assert (d.version, d.variant) == (8, uuid.RFC_4122)
    assert UUID_V8.fullmatch(vector["d"])


def test_derive_d_vectors_show_utf8_and_no_normalisation() -> None:
    by_name = {v["name"]: v for v in DERIVED["vectors"]}
    nfc = by_name["non-ASCII key, NFC: U+00E9 is two UTF-8 bytes c3 a9"]
    nfd = by_name["non-ASCII key, NFD: e + U+0301 (cc 81) is another key, hashed as given, not normalised"]
    assert nfc["preimage_hex"].endswith("636166c3a9") and nfd["preimage_hex"].endswith("63616665cc81")
    assert nfc["d"] != nfd["d"]
    assert by_name["astral-plane key: U+1F680 is four UTF-8 bytes f0 9f 9a 80"]["preimage_hex"].find("f09f9a80") > 0
    non_ascii_types = [v for v in DERIVED["vectors"] if not v["type"].isascii()]
    assert non_ascii_types and all(not v["type_valid_in_envelope"] for v in non_ascii_types)
    assert len({v["d"] for v in DERIVED["vectors"]}) == len(DERIVED["vectors"])


def integer_uuid_v8(digest16: bytes) -> str:
    """RFC 9562 section 5.8 bits, set on the 128-bit integer (a second implementation)."""
    n = int.from_bytes(digest16, "big")
    n = (n & ~(0xF << 76)) | (0x8 << 76)  # version, bits 48-51
    n = (n & ~(0x3 << 62)) | (0x2 << 62)  # variant 0b10, bits 64-65
    x = f"{n:032x}"
    return f"{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:]}"


@given(scalar_text, scalar_text, scalar_text)
def test_derive_d_on_any_strings(h: str, type_name: str, key: str) -> None:
    d = derive_d(h, type_name, key)
    full = hashlib.sha256(("nip-ar-artifact\0" + h + "\0" + type_name + "\0" + key).encode("utf-8")).digest()
    assert d == integer_uuid_v8(full[:16])
    assert UUID_V8.fullmatch(d) and uuid.UUID(d).version == 8
    assert derive_d(h, type_name, key) == d


def test_derive_d_refuses_unpaired_surrogates() -> None:
    with pytest.raises(ValueError, match="unpaired surrogates"):
        derive_d("h", "t", "\ud800")
