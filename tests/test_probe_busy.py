"""The host probe's cache and a busy machine: a probe taken beside other work (its DRAM read can be
far low) is cached marked busy and measured again by the first process that finds the machine
quiet, which keeps the higher DRAM read. The probe itself is replaced by a recorded result here."""
from __future__ import annotations

from pathlib import Path

import pytest

from xfc.tiledb import probe

pytestmark = pytest.mark.unit

CPUINFO = Path("/proc/cpuinfo")


class FakeProbe:
    """measure_host's result: DRAM read and the 1-minute load average when the probe started."""

    def __init__(self, monkeypatch):
        self.calls = 0
        self.next = (20.0, 0.0)
        self.overflow = 1.5
        monkeypatch.setattr(probe, "measure_host", self)

    def __call__(self, flags, repeats=probe.REPEATS, l3_bytes=None, l2_bytes=None):
        self.calls += 1
        dram, load = self.next
        fma = {bits: 2.0 for bits in probe.widths_for(flags)}
        conditions = {"loadavg_before": load, "loadavg_after": load}
        return 3.0, fma, 4.0, 5, 0.01, conditions, "gcc (fake)", dram, dram * 2, self.overflow


@pytest.fixture
def probed(tmp_path, monkeypatch):
    """(the fake probe, the load average now (a dict to change), run(**kw): host_probe on a cache in tmp_path)."""
    fake = FakeProbe(monkeypatch)
    load_now = {"value": 4.0}
    monkeypatch.setattr(probe.hostcc, "load_average", lambda: load_now["value"])
    monkeypatch.setattr(probe.os, "cpu_count", lambda: 2)
    environ = {"XFC_CACHE_DIR": str(tmp_path)}
    cpuinfo = CPUINFO.read_text()

    def run(**kw):
        return probe.host_probe(environ, cpuinfo_text=cpuinfo, machine_id="test-machine", **kw)

    return fake, load_now, run


def test_a_busy_probe_is_measured_again_when_quiet_and_keeps_the_higher_read(probed):
    fake, load_now, run = probed
    fake.next = (8.1, 3.0)                       # beside other work: a low read, cached as busy
    first = run()
    assert (first.dram_read_gbps, first.measured_busy, fake.calls) == (8.1, True, 1)
    again = run()                                # still busy now: the cached figure, no probe
    assert again.cached and again.dram_read_gbps == 8.1 and fake.calls == 1
    load_now["value"] = 0.2                      # quiet now: measured again
    fake.next = (23.0, 0.2)
    quiet = run()
    assert (quiet.cached, quiet.dram_read_gbps, quiet.measured_busy, fake.calls) == (False, 23.0, False, 2)
    load_now["value"] = 9.0
    assert run().dram_read_gbps == 23.0 and fake.calls == 2       # a quiet figure stays, whatever the load
    # a busy probe that read higher than the quiet re-measure: the higher read is kept
    fake.next, load_now["value"] = (30.0, 3.0), 3.0
    assert run(remeasure=True).dram_read_gbps == 30.0 and fake.calls == 3
    fake.next, load_now["value"] = (22.0, 0.1), 0.1
    kept = run()
    assert (kept.dram_read_gbps, kept.measured_busy, fake.calls) == (30.0, False, 4)
    # an explicit --remeasure on a quiet machine takes what it measures
    fake.next = (21.0, 0.1)
    assert run(remeasure=True).dram_read_gbps == 21.0 and fake.calls == 5


def test_the_past_l3_speedup_is_cached_taken_from_the_quiet_re_measure_and_measured_once_where_missing(
        probed, tmp_path):
    fake, load_now, run = probed
    fake.next, fake.overflow = (8.1, 3.0), 1.9       # busy: a ratio is not a rate; no maximum is kept
    assert run().l3_overflow_read_speedup == 1.9
    assert run().l3_overflow_read_speedup == 1.9 and fake.calls == 1      # cached
    load_now["value"], fake.next, fake.overflow = 0.2, (23.0, 0.2), 1.6
    assert run().l3_overflow_read_speedup == 1.6 and fake.calls == 2      # the quiet re-measure's own
    fake.overflow = None                                                  # no L3 or one CPU: 0 in the cache
    assert run(remeasure=True).l3_overflow_read_speedup is None
    assert run().cached and fake.calls == 3
    # a cache written before the figure existed lacks its row: measured again once, then cached
    from xfc.tiledb.store import TileDb
    with TileDb.open(tmp_path / "tile-db.sqlite") as db:
        db.transact(lambda conn: conn.execute("DELETE FROM calibration WHERE name = ?", (probe.OVERFLOW_ROW,)),
                    "drop the row")
    fake.overflow = 1.7
    assert not run().cached and fake.calls == 4
    assert run().cached and run().l3_overflow_read_speedup == 1.7 and fake.calls == 4
