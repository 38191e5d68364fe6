from __future__ import annotations

import uuid

from proxy.request_id import is_uuid, new_request_id


def test_new_ids_are_distinct_version_4_uuids() -> None:
    ids = {new_request_id() for _ in range(1_000)}
    assert len(ids) == 1_000
    for value in list(ids)[:50]:
        parsed = uuid.UUID(value)
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122 and str(parsed) == value
        assert is_uuid(value)


def test_only_the_dashed_uuid_shape_counts() -> None:
    assert is_uuid("6F1C0E52-4A8E-4D7C-9B1E-2F5A7C3D9E10")
    for value in ("trace-42", "0123456789abcdef01234567", "6f1c0e524a8e4d7c9b1e2f5a7c3d9e10",
                  "6f1c0e52-4a8e-4d7c-9b1e-2f5a7c3d9e1", "6f1c0e52-4a8e-4d7c-9b1e-2f5a7c3d9e1g",
                  "{6f1c0e52-4a8e-4d7c-9b1e-2f5a7c3d9e10}", ""):  # fmt: skip
        assert not is_uuid(value), value
