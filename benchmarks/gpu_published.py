#!/usr/bin/env python3
"""GPU predictions next to published measurements (tile_db/published.yaml).

    .venv/bin/python benchmarks/gpu_published.py

For every published figure: what xfc predicts for it from the shipped GPU description alone
(static), and with an ALU efficiency fitted from published FMA-peak micro-benchmarks (applied to
the GPU it came from - a fit - and to other GPUs of its family - a prediction). FMA-peak figures
are compared with the description's peak; SGEMM figures with xfc's GPU synthesis of that matmul.
Figures marked not comparable are shown with the reason and left out of the check.
Issue 11's target: within 30% of every comparable published figure.
Output: a table and benchmarks/results/gpu_published.json. No GPU is run: this is all prediction.
"""
from __future__ import annotations

import sys
from pathlib import Path

from xfc.gpu.synth import synthesize_gpu
from xfc.hardware.figures import derived_figures
from xfc.hardware.load import load
from xfc.ops.spec import make_spec
from xfc.outputs import write_json_result
from xfc.tiledb.published import alu_efficiencies, efficiency_for, load_published
from machine import machine_facts

REPO = Path(__file__).resolve().parent.parent
TARGET = 0.30


def described_peak(gpu_name: str) -> float:
    return derived_figures(load(gpu_name))["gpu_peak_fp32_gflops"]


def predicted(figure, alu_efficiency: float) -> float:
    if figure.kind == "fma_peak":
        return described_peak(figure.hardware) * alu_efficiency
    spec = make_spec("matmul", dict(m=figure.m, n=figure.n, k=figure.k))
    return synthesize_gpu(spec, load(figure.hardware), dtype=figure.dtype,
                          alu_efficiency=alu_efficiency).predicted_gflops


def main(argv=None) -> int:
    figures = load_published()
    fitted = alu_efficiencies(figures, described_peak)
    rows = []
    for f in figures:
        static = predicted(f, 1.0)
        eff = efficiency_for(f.hardware, fitted)
        calibrated = predicted(f, eff[0]) if eff else None
        rows.append(dict(
            id=f.id, hardware=f.hardware, kind=f.kind, shape=f"{f.m}x{f.n}x{f.k}" if f.kind == "sgemm" else "",
            published_gflops=f.gflops, source=f.source, uncertain=f.uncertain, comparable=f.comparable, why=f.why,
            static_gflops=round(static, 1), static_ratio=round(static / f.gflops, 3),
            alu_efficiency=round(eff[0], 4) if eff else None, efficiency_from=eff[1] if eff else None,
            efficiency_how=eff[2] if eff else "no published FMA figure for this GPU family",
            calibrated_gflops=round(calibrated, 1) if calibrated else None,
            calibrated_ratio=round(calibrated / f.gflops, 3) if calibrated else None))
    print(f"{'figure':<34} {'kind':<8} {'published':>9} {'static':>8} {'ratio':>6} {'calibr.':>8} {'ratio':>6}  comparable")
    for r in rows:
        cal = f"{r['calibrated_gflops']:>8.1f} {r['calibrated_ratio']:>6.2f}" if r["calibrated_gflops"] else f"{'-':>8} {'-':>6}"
        print(f"{r['id']:<34} {r['kind']:<8} {r['published_gflops']:>9.1f} {r['static_gflops']:>8.1f} "
              f"{r['static_ratio']:>6.2f} {cal}  {'yes' if r['comparable'] else 'no: ' + r['why'][:60] + '...'}")
        print(f"{'':<34} efficiency: {r['efficiency_how']}")
    comparable = [r for r in rows if r["comparable"]]
    within = [abs((r["calibrated_ratio"] or r["static_ratio"]) - 1) <= TARGET for r in comparable]
    print(f"comparable figures within {TARGET:.0%} (calibrated where possible): {sum(within)}/{len(comparable)}; "
          f"static: {sum(abs(r['static_ratio'] - 1) <= TARGET for r in comparable)}/{len(comparable)}")
    write_json_result(REPO / "benchmarks" / "results" / "gpu_published.json",
                      dict(target=TARGET, rows=rows, fitted=fitted,
                           machine={**machine_facts(),
                                    "note": "predictions from the descriptions; the host CPU does not enter them"},
                           note="predictions only; no GPU is run. A figure used for its own GPU's fit is not a "
                                "validation."), kind="gpu_published")
    return 0


if __name__ == "__main__":
    sys.exit(main())
