"""The counters' contract: fixed histogram buckets and the fields the scripts write."""

from __future__ import annotations

from producer.metrics.collector import Snapshot, _cumulative, counter_families
from producer.metrics.server import loopback, token_ok
from producer.protocol import stats


def test_a_value_counts_in_the_first_bucket_it_fits() -> None:
    assert stats.bucket_of(0.0) == "0.01"
    assert stats.bucket_of(0.01) == "0.01"  # le: the bound itself is inside
    assert stats.bucket_of(0.011) == "0.025"
    assert stats.bucket_of(3600.0) == "3600.0"
    assert stats.bucket_of(3600.1) == stats.INF
    assert _cumulative({"0.01": 2, "1.0": 1, stats.INF: 1})[-1] == (stats.INF, 4.0)


def test_counters_of_unknown_tenants_and_odd_fields_are_left_out() -> None:
    snap = Snapshot(
        tenants=["a"],
        counters={
            "jobs|a|process|succeeded": "3",
            "jobs|gone|process|failed": "9",  # a removed tenant
            "jobs|a|x": "1",  # not a field the scripts write
            "refused|a|rate": "2",
            "redeliveries": "4",
        },
    )
    families = {f.name: f for f in counter_families(snap)}
    jobs = [(s.labels, s.value) for s in families["sandfarm_jobs"].samples]
    assert jobs == [({"tenant": "a", "backend": "process", "status": "succeeded"}, 3.0)]
    assert families["sandfarm_redeliveries"].samples[0].value == 4


def test_tokens_and_loopback() -> None:
    assert token_ok(None, "") and token_ok("Bearer t", "t") and token_ok("bearer t", "t")
    assert not token_ok(None, "t") and not token_ok("Bearer u", "t") and not token_ok("t", "t")
    assert not token_ok("Bearer \xe9", "t")  # non-ASCII (latin-1 headers): refused, no 500
    assert loopback("127.0.0.1") and loopback("::1") and loopback("localhost")
    assert not loopback("0.0.0.0") and not loopback("10.0.0.1") and not loopback("example")


def test_request_methods_a_client_invents_share_one_label() -> None:
    from producer.gateway.metrics import method_label

    assert method_label({"method": "GET"}) == "GET" and method_label({"method": "POST"}) == "POST"
    invented = {method_label({"method": f"ZZ{i}"}) for i in range(100)}
    assert invented == {"other"} and method_label({}) == "other"
