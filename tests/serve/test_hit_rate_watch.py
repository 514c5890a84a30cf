"""The serve hit-rate warning: judged over windows of recent lookups, not since start."""
import logging

from ssd.serve.metrics import HitRateWatch


class FakeStats:
    def __init__(self):
        self.lookups = self.hits = 0

    def __call__(self):
        return {"cache_lookups": self.lookups, "cache_hits": self.hits}


def test_warns_on_a_window_below_the_threshold(caplog, monkeypatch):
    clock = [0.0]
    monkeypatch.setattr("ssd.serve.metrics.time.monotonic", lambda: clock[0])
    stats = FakeStats()
    watch = HitRateWatch(stats, threshold=0.6, window_s=10, min_lookups=50)
    stats.lookups, stats.hits = 1000, 900  # a good start
    clock[0] = 10
    with caplog.at_level(logging.WARNING, logger="ssd.serve"):
        assert watch.check() == 0.9
        stats.lookups, stats.hits = 1100, 940  # the last window: 40 of 100, though 0.85 since start
        clock[0] = 15
        assert watch.check() is None  # the window is not over
        clock[0] = 20
        assert watch.check() == 0.4
        stats.lookups, stats.hits = 1120, 940  # too few lookups to judge
        clock[0] = 30
        assert watch.check() is None
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "hit rate 0.40" in warnings[0] and "below 0.60" in warnings[0]
