"""The benchmarks' timing loops (``mate.mamba.bench.timing``) on the CPU, with the device parts stubbed: every
implementation of a case is timed in interleaved rounds whose first implementation rotates, a failing capture is
reported for its implementation only, and the result per implementation is the median of its own samples."""

from __future__ import annotations

import types

import pytest

timing = pytest.importorskip("mate.mamba.bench.timing")


class _Graph:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def replay(self):
        self.log.append(self.name)


def _stub(monkeypatch, log, fail=()):
    mod = types.SimpleNamespace(synchronize=lambda: None)
    monkeypatch.setattr(timing, "device_module", lambda dev: mod)

    def capture(dev, m, fns):
        name = fns[0]()
        if name in fail:
            raise RuntimeError(f"{name} cannot be captured")
        return _Graph(name, log)

    monkeypatch.setattr(timing, "_capture", capture)
    # the device time of one timed loop: the replay's graph name picks a per-implementation cost, plus the
    # position in the whole sequence (a machine that drifts slower over time)
    cost = {"a": 1.0, "b": 2.0, "c": 3.0}

    def device_ms(m, replay, times):
        replay()
        return cost[log[-1]] + 0.01 * len(log)

    monkeypatch.setattr(timing, "_device_ms", device_ms)


def test_graph_times_interleaved_and_rotating(monkeypatch):
    log = []
    _stub(monkeypatch, log)
    fns = {n: [lambda n=n: n, lambda n=n: n] for n in "abc"}  # two windows each
    got = timing.graph_times_us(fns, replays=10, repeats=3, device="cpu")
    assert log == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    # per call: ms * 1e3 / (replays * windows); medians of each one's own samples
    assert got["a"] == pytest.approx((1.0 + 0.06) * 1e3 / 20)
    assert got["b"] == pytest.approx((2.0 + 0.04) * 1e3 / 20)
    assert got["c"] == pytest.approx((3.0 + 0.05) * 1e3 / 20)


def test_graph_times_failure_is_per_implementation(monkeypatch):
    log = []
    _stub(monkeypatch, log, fail=("b",))
    got = timing.graph_times_us({n: [lambda n=n: n] for n in "abc"}, replays=1, repeats=2, device="cpu")
    assert list(got) == ["a", "b", "c"] and isinstance(got["b"], RuntimeError)
    assert "b" not in log and log == ["a", "c", "c", "a"]
    with pytest.raises(RuntimeError, match="cannot be captured"):
        timing.graph_time_us([lambda: "b"], device="cpu")


def test_host_times_interleaved(monkeypatch):
    mod = types.SimpleNamespace(synchronize=lambda: None)
    monkeypatch.setattr(timing, "device_module", lambda dev: mod)
    calls = []
    got = timing.host_times_us({n: (lambda n=n: calls.append(n)) for n in "ab"}, iters=2, rounds=2, device="cpu")
    # 5 warm-up calls each, then round 1: a a b b, round 2: b b a a
    assert calls == ["a"] * 5 + ["b"] * 5 + ["a", "a", "b", "b", "b", "b", "a", "a"]
    assert set(got) == {"a", "b"} and all(v >= 0 for v in got.values())
