"""Published figures (tile_db/published.yaml): strict loading, the ALU-efficiency fit, the GPU seam."""
from __future__ import annotations

import pytest

from xfc.errors import XfcError
from xfc.gpu.synth import synthesize_gpu
from xfc.hardware.load import load
from xfc.ops.spec import make_spec
from xfc.tiledb.published import alu_efficiencies, efficiency_for, family_key, load_published

pytestmark = pytest.mark.unit


def test_the_shipped_figures_load_and_say_why_when_not_comparable():
    figures = load_published()
    assert {f.hardware for f in figures} >= {"adreno-640", "adreno-740"}
    for f in figures:
        assert f.source.startswith("https://") and f.source_tag == f"published:{f.id}"
        assert f.comparable or f.why
        load(f.hardware)                       # names a shipped description


@pytest.mark.parametrize("text,needle", [
    ("figures: {}", "'figures' list"),
    ("figures: [{id: a, hardware: adreno-640, kind: peak, dtype: fp32, gflops: 1, comparable: true, uncertain: false, source: s}]", "kind"),
    ("figures: [{id: a, hardware: adreno-640, kind: fma_peak, dtype: fp32, gflops: -3, comparable: true, uncertain: false, source: s}]", "gflops"),
    ("figures: [{id: a, hardware: adreno-640, kind: sgemm, dtype: fp32, gflops: 3, comparable: true, uncertain: false, source: s}]", "m, n and k"),
    ("figures: [{id: a, hardware: adreno-640, kind: fma_peak, dtype: fp32, gflops: 3, comparable: false, uncertain: false, source: s}]", "say why"),
    ("figures: [{id: a, hardware: adreno-640, kind: fma_peak, dtype: fp32, gflops: 3, comparable: true, uncertain: false, source: s, colour: red}]", "unknown field"),
    ("figures: [: bad", "not valid YAML"),
])
def test_bad_files_are_one_line_errors(tmp_path, text, needle):
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(XfcError) as err:
        load_published(path)
    assert needle in str(err.value) and str(path) in str(err.value) and "\n" not in str(err.value)


def test_efficiency_fit_and_family_carry_over():
    figures = load_published()
    fitted = alu_efficiencies(figures, lambda name: 1000.0)
    eff, fid, how = efficiency_for("adreno-640", fitted)
    assert eff == pytest.approx(0.407) and "a fit" in how
    assert family_key("adreno-650") == family_key("adreno-640") != family_key("adreno-740")
    assert "a prediction" in efficiency_for("adreno-650", fitted)[2]
    assert efficiency_for("mali-g78", fitted) is None


def test_alu_efficiency_scales_only_alu_bound_predictions():
    spec = make_spec("matmul", dict(m=1024, n=1024, k=1024))
    hw = load("adreno-740")
    full = synthesize_gpu(spec, hw)
    assert synthesize_gpu(spec, hw, alu_efficiency=1.0).plan == full.plan
    half = synthesize_gpu(spec, hw, alu_efficiency=0.5)
    assert half.predicted_gflops < full.predicted_gflops
    assert half.predicted_gflops >= full.predicted_gflops * 0.5 - 1e-9
