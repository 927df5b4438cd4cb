"""Server-generated object keys and the key validator that makes path traversal impossible."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aivedio_engine.storage import keys
from aivedio_engine.storage.keys import InvalidKey, validate_key

T = uuid.UUID("01890000-0000-7000-8000-000000000001")
A = uuid.UUID("01890000-0000-7000-8000-0000000000aa")
K = uuid.UUID("01890000-0000-7000-8000-0000000000bb")
N = uuid.UUID("01890000-0000-7000-8000-0000000000cc")


def test_original_upload_key_is_tenant_scoped_and_typed_by_declared_content_type() -> None:
    assert keys.asset_original_key(T, A, "video/mp4") == f"tenants/{T}/assets/{A}/original.mp4"
    assert keys.asset_original_key(str(T), str(A), "image/jpeg") == f"tenants/{T}/assets/{A}/original.jpg"
    assert keys.asset_original_key(T, A, "video/quicktime").endswith("/original.mov")
    with pytest.raises(InvalidKey):
        keys.asset_original_key(T, A, "text/html")


def test_raw_output_key_follows_design_layout() -> None:
    assert keys.raw_output_key(T, K, N, 0) == f"tenants/{T}/tasks/{K}/raw/{N}/0.mp4"
    assert keys.raw_output_key(T, K, N, 3).endswith("/raw/" + str(N) + "/3.mp4")
    for bad in (-1, True, 1.0, "1"):
        with pytest.raises(InvalidKey):
            keys.raw_output_key(T, K, N, bad)  # type: ignore[arg-type]


def test_derivative_keys_carry_profile_and_pipeline_version() -> None:
    assert keys.derivative_key(T, A, "proxy_mp4", 3, "main.mp4") == f"tenants/{T}/assets/{A}/proxy_mp4/v3/main.mp4"
    assert keys.derivative_prefix(T, A, "hls", 1) == f"tenants/{T}/assets/{A}/hls/v1/"
    assert keys.derivative_key(T, A, "hls", 1, "seg_00001.m4s").startswith(keys.derivative_prefix(T, A, "hls", 1))


def test_derivative_owner_reads_back_what_derivative_key_wrote() -> None:
    """The orphan scan credits every file of a derivative directory (HLS segments) to its asset row."""
    for profile in ("proxy_mp4", "hls", "thumbnail", "waveform"):
        for name in ("index.m3u8", "seg_001.m4s", "init.mp4"):
            assert keys.derivative_owner(keys.derivative_key(T, A, profile, 12, name)) == (A, profile, 12)
    for other in (
        keys.asset_original_key(T, A, "video/mp4"),
        keys.raw_output_key(T, K, N, 0),
        keys.upload_staging_key(T, N),
        f"tenants/{T}/assets/{A}/poster/v1/x.jpg",
        f"tenants/{T}/assets/{A}/hls/v0/x.m4s",
        f"tenants/{T}/assets/{A}/hls/v1/a/b.m4s",
        f"tenants/{T}/assets/{A}/hls/v1/",
        f"tenants/{T}/assets/not-a-uuid-not-a-uuid-not-a-uuid-0/hls/v1/x",
    ):
        assert keys.derivative_owner(other) is None, other
    with pytest.raises(InvalidKey):
        keys.derivative_key(T, A, "original", 1, "x.mp4")  # not a derivative profile
    for version in (0, -1, True):
        with pytest.raises(InvalidKey):
            keys.derivative_prefix(T, A, "thumbnail", version)
    for name in ("a/b.jpg", "..", ".hidden", "", "x y.jpg", "../../etc/passwd"):
        with pytest.raises(InvalidKey):
            keys.derivative_key(T, A, "thumbnail", 1, name)


def test_ids_must_be_uuids_so_a_crafted_id_cannot_inject_segments() -> None:
    with pytest.raises(ValueError):
        keys.asset_original_key("../other-tenant", A, "video/mp4")
    with pytest.raises(ValueError):
        keys.raw_output_key(T, "x/../../y", N, 0)
    # canonical form: upper-case or braced input gives the same key
    assert keys.tenant_prefix(str(T).upper()) == keys.tenant_prefix("{" + str(T) + "}") == f"tenants/{T}/"


@pytest.mark.parametrize(
    "key",
    [
        "",
        "/etc/passwd",
        "../x",
        "a/../b",
        "a/./b",
        "a//b",
        "a/",
        ".meta/x",
        "a/.tmp/b",
        ".",
        "..",
        "a b",
        "a\\b",
        "a\x00b",
        "a\nb",
        "ключ",
        "a?b",
        "a#b",
        "a%2e%2e/b",
        "C:/x",
        "$key",
        "a/${filename}",
        "x" * 1025,
    ],
)
def test_validator_refuses_unsafe_keys(key: str) -> None:
    with pytest.raises(InvalidKey):
        validate_key(key)


@pytest.mark.parametrize("key", ["a", "a/b.c", "tenants/x/assets/y/original.mp4", "A-Z_0.9/x-y_z", "x" * 1024])
def test_validator_accepts_plain_keys(key: str) -> None:
    assert validate_key(key) == key


def test_validator_rejects_non_strings() -> None:
    with pytest.raises(InvalidKey):
        validate_key(None)  # type: ignore[arg-type]


@given(st.text(alphabet=st.sampled_from(list("ab./_-\\ \x00:~")), max_size=30))
def test_any_accepted_key_stays_inside_the_store_root(key: str) -> None:
    root = Path("/srv/objects")
    try:
        validate_key(key)
    except InvalidKey:
        return
    resolved = (root / key).resolve(strict=False)
    assert resolved.is_relative_to(root) and resolved != root
    assert not any(part.startswith(".") for part in key.split("/"))
