"""Calibration measurement files (issue 34): `xfc tiledb calibrate --save-measurements` writes what was
timed, `--from-measurements` fits to one or more such files without timing (pooled: the fastest of
each operator), and refuses files of another machine, of another training set, or not such files."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from xfc.errors import XfcError
from xfc.hardware.host import describe_host
from xfc.tiledb.calibrate import (DEFAULT_CONSTANTS, fit, measurements_document, plan_identity, read_measurements,
                                  training_cases)

from support.calibration import CLUSTER, FACTS, HW, synthetic_items

# a direct GEMM, a depthwise, and one Winograd training layer's plans (direct and every m): the
# kinds of record a file holds, a handful of synthesis calls
_CASES = training_cases()
_WINOGRAD_LAYER = next(c.spec for c in _CASES if c.lowering == "winograd")
CASES = [_CASES[0], next(c for c in _CASES if c.spec.__class__.__name__ == "DepthwiseSpec")] + \
    [c for c in _CASES if c.spec == _WINOGRAD_LAYER]


def _items(scale: float = 1.0):
    truth = replace(DEFAULT_CONSTANTS, compute_efficiency=0.8, winograd_store_cycles=2.0)
    items = synthetic_items(CASES, truth, winograd_vectors=None)
    return [replace(i, measured_s=i.measured_s * scale) for i in items]


def _write(tmp_path, name, items, hw=HW, cluster=CLUSTER):
    path = tmp_path / name
    document = measurements_document(items, hw, cluster, repeats=15, compiler="gcc 12.2.0",
                                     measured_at="2026-12-07T00:00:00Z")
    path.write_text(json.dumps(document))
    return path


@pytest.mark.unit
def test_a_saved_file_reads_back_as_the_measurements_it_was_written_from(tmp_path):
    items = _items()
    path = _write(tmp_path, "m.json", items)
    document = json.loads(path.read_text())
    assert document["hardware"] == HW.name and document["compiler"] == "gcc 12.2.0"
    assert document["cpu"] == HW.marketing_name and document["cores"] == CLUSTER.count and "avx512f" in document["isa"]
    assert len(document["records"]) == len(items) and document["facts"]["clock_ghz"] == CLUSTER.clock_ghz
    back = read_measurements([path], HW, CLUSTER)
    assert sorted(back, key=repr) == sorted(items, key=repr)
    # so a refit from the file is the fit of the measurements themselves
    assert fit(back, HW, CLUSTER) == fit(items, HW, CLUSTER)


@pytest.mark.unit
def test_several_files_pool_to_the_fastest_time_of_each_operator(tmp_path):
    slow, fast = _items(1.3), _items()
    mixed = [f if index % 2 else s for index, (s, f) in enumerate(zip(slow, fast))]
    paths = [_write(tmp_path, "a.json", slow), _write(tmp_path, "b.json", mixed)]
    by_key = {(i.spec, i.threads, plan_identity(i.plan)): i for i in read_measurements(paths, HW, CLUSTER)}
    for s, f, m in zip(slow, fast, mixed):
        pooled = by_key[(s.spec, s.threads, plan_identity(s.plan))]
        assert pooled.measured_s == min(s.measured_s, m.measured_s)
    # contended (left out of the fit) only if every file says so
    contended = [replace(i, contended=True) for i in fast]
    paths = [_write(tmp_path, "c.json", contended), _write(tmp_path, "d.json", slow)]
    assert not any(m.contended for m in read_measurements(paths, HW, CLUSTER))
    assert all(m.contended for m in read_measurements([paths[0]], HW, CLUSTER))


@pytest.mark.unit
def test_a_plan_xfc_no_longer_synthesizes_is_left_out_and_said(tmp_path):
    items = _items()
    path = _write(tmp_path, "m.json", items)
    document = json.loads(path.read_text())
    document["records"][0]["plan"] = document["records"][0]["plan"].replace('"kc":', '"kc_was":')
    path.write_text(json.dumps(document))
    warnings = []
    back = read_measurements([path], HW, CLUSTER, warn=warnings.append)
    assert len(back) == len(items) - 1 and len(warnings) == 1
    assert warnings[0].startswith(f"1 of {len(items)} measured plans are no longer") and CASES[0].describe() in warnings[0]
    for record in document["records"]:
        record["plan"] = "{}"
    path.write_text(json.dumps(document))
    with pytest.raises(XfcError, match="no measurement left to fit"):
        read_measurements([path], HW, CLUSTER)


@pytest.mark.unit
def test_files_of_another_machine_or_of_no_calibration_are_refused_in_one_line(tmp_path):
    other = describe_host({**FACTS, "cpu MHz": "2000.000"}, {}, 2, "x86_64")
    items = _items()
    path = _write(tmp_path, "other.json", items, other, other.cluster())
    with pytest.raises(XfcError, match=r"other\.json: measured on another machine or another description"):
        read_measurements([path], HW, CLUSTER)
    bad = tmp_path / "bad.json"
    for text, expected in (("{not json", "not JSON"), (json.dumps({"format": "x"}), "not a measurement file"),
                           (json.dumps([1, 2]), "not a measurement file")):
        bad.write_text(text)
        with pytest.raises(XfcError, match=expected) as caught:
            read_measurements([bad], HW, CLUSTER)
        assert str(bad) in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(XfcError, match="cannot read it"):
        read_measurements([tmp_path / "missing.json"], HW, CLUSTER)
    document = json.loads(_write(tmp_path, "m.json", items).read_text())
    document["records"][0]["case"] = "matmul M=1 N=1 K=1 epilogue=none"
    bad.write_text(json.dumps(document))
    with pytest.raises(XfcError, match="is not one of this xfc's training operators"):
        read_measurements([bad], HW, CLUSTER)
    for broken in ({"measured_s": None}, {"measured_s": 0.0}, {"measured_s": -1e-3}, {"spread": "wide"}):
        document["records"][0] = {**document["records"][1], **broken}
        bad.write_text(json.dumps(document))
        with pytest.raises(XfcError, match="a record without case, threads and a positive measured_s"):
            read_measurements([bad], HW, CLUSTER)
    document["records"][0] = "not a record"
    bad.write_text(json.dumps(document))
    with pytest.raises(XfcError, match="a record without"):
        read_measurements([bad], HW, CLUSTER)
