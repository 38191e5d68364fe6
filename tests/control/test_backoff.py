from __future__ import annotations

import pytest

from proxy.control.backoff import backoff_s, full_jitter, retry_after_s
from proxy.policies.spec import RetrySpec


def test_backoff_grows_exponentially_up_to_the_cap() -> None:
    spec = RetrySpec(base_s=0.5, factor=2, cap_s=8)
    ceilings = [backoff_s(spec, n, lambda top: top) for n in range(7)]
    assert ceilings == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]


def test_backoff_is_fully_jittered() -> None:
    spec = RetrySpec(base_s=1, factor=3, cap_s=100)
    assert backoff_s(spec, 2, lambda top: top / 2) == 4.5
    waits = [full_jitter(2.0) for _ in range(200)]
    assert all(0 <= w <= 2.0 for w in waits) and min(waits) < 0.5 < 1.5 < max(waits)


def test_a_huge_factor_stays_at_the_cap() -> None:
    spec = RetrySpec(base_s=1, factor=1e300, cap_s=8)
    assert backoff_s(spec, 5, lambda top: top) == 8


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after": "2"}, 2.0),
        ({"Retry-After": "0.25"}, 0.25),
        ({"retry-after-ms": "1500"}, 1.5),
        ({"retry-after": "9", "retry-after-ms": "1500"}, 1.5),  # the precise one wins
        ({"retry-after-ms": "soon", "retry-after": "3"}, 3.0),
        ({"retry-after": "Thu, 01 Jan 1970 00:00:30 GMT"}, 20.0),  # wall clock at 10 s
        ({"retry-after": "Thu, 01 Jan 1970 00:00:05 GMT"}, 0.0),  # already past
        ({"retry-after": "-1"}, None),
        ({"retry-after": "nan"}, None),
        ({"retry-after": "whenever"}, None),
        ({"x-ratelimit-remaining": "0"}, None),
    ],
)
def test_retry_after_hints(headers: dict[str, str], expected: float | None) -> None:
    assert retry_after_s(headers, wall=lambda: 10.0) == expected
