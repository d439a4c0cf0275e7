"""Bad values of `xfc synth` options and the text output of `xfc hw show`: one line, exit 2,
nothing written; shared formatting of what the command line prints (issue 35's smaller items)."""
from __future__ import annotations

from pathlib import Path

import pytest

from xfc.cli import main
from xfc.errors import OperatorError
from xfc.hardware.load import load as load_hw
from xfc.tiledb.locations import resolve

pytestmark = pytest.mark.unit

MATMUL = ["synth", "matmul", "--hw", "snapdragon-865", "--shape", "m=4,n=4,k=4"]


def run(argv, capsys):
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(code, out, err, *needles):
    assert code == 2, (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("xfc: error: ") and "Traceback" not in out + err, err
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_tile_db_path_that_does_not_exist_is_exit_2(tmp_path, capsys):
    missing = tmp_path / "nope.sqlite"
    out_dir = tmp_path / "out"
    code, out, err = run(MATMUL + ["--tile-db", str(missing), "-o", str(out_dir)], capsys)
    assert_one_line_error(code, out, err, f"--tile-db {missing}", "no such file")
    assert not out_dir.exists()


def test_tile_db_path_that_is_a_directory_or_not_sqlite_is_exit_2(tmp_path, capsys):
    """The user named it: a directory or a file that is not SQLite at all is a typo, not a warning
    (a damaged or locked database still warns and synthesis goes on: tests/test_calibrate.py)."""
    text = tmp_path / "notes.txt"
    text.write_text("not a database\n")
    for path, needle in ((tmp_path, "a directory, not a tile database file"), (text, "not an SQLite file")):
        out_dir = tmp_path / "out"
        code, out, err = run(MATMUL + ["--tile-db", str(path), "-o", str(out_dir)], capsys)
        assert_one_line_error(code, out, err, f"--tile-db {path}", needle)
        assert not out_dir.exists()


def test_tile_db_auto_off_and_existing_paths_still_resolve(tmp_path):
    hw = load_hw("snapdragon-865")
    env = {"XFC_CACHE_DIR": str(tmp_path / "cache")}
    assert resolve("off", hw, env) is None
    assert resolve("auto", hw, env) is not None            # shipped or per-user: need not exist yet
    present = tmp_path / "mine.sqlite"
    present.write_bytes(b"SQLite format 3\x00damaged")     # an SQLite file: the evaluator warns about it, not resolve
    assert resolve(str(present), hw, env) == Path(present)
    with pytest.raises(OperatorError, match="no such file"):
        resolve(str(tmp_path / "nope.sqlite"), hw, env)


@pytest.mark.parametrize("value", ["0", "-3"])
@pytest.mark.parametrize("command", [MATMUL, ["bench", "matmul", "--hw", "cortex-a76", "--shape", "m=4,n=4,k=4",
                                              "--device", "qemu"]], ids=["synth", "bench"])
def test_repeat_below_one_is_exit_2_like_bench(tmp_path, capsys, command, value):
    out_dir = tmp_path / "out"
    code, out, err = run(command + ["--bench", "--repeat", value, "-o", str(out_dir)] if command[0] == "synth"
                         else command + ["--repeat", value], capsys)
    assert_one_line_error(code, out, err, f"--repeat must be >= 1, got {value}")
    assert not out_dir.exists()


def test_format_ratio_keeps_two_significant_digits():
    from xfc.ops.accuracy import format_ratio
    for ratio in (0.0022, 0.000317, 0.31, 4.7, 12.0):
        text = format_ratio(ratio)
        assert float(text) != 0.0 and abs(float(text) - ratio) <= 0.05 * ratio, (ratio, text)
        assert len(text.replace("0.", "").lstrip("0").replace(".", "")) <= 2, text
    assert format_ratio(1.004) != "1" and float(format_ratio(1.004)) > 1     # a failure never prints as 1
    assert float(format_ratio(0.996)) < 1
    assert "e" not in format_ratio(99.96) and "e" not in format_ratio(12345.6)
    assert format_ratio(0.0) == "0" and format_ratio(float("inf")) == "inf"


def test_synth_summary_prints_small_ratios_with_significant_digits(capsys):
    from xfc.cli.synth import print_summary
    print_summary({"operator": "matmul", "target": "cpu", "hardware": "h", "shape": "m=4", "synthesis_seconds": 0.001,
                   "verified": True, "verified_on": "host", "max_abs_error": 1e-9, "error_to_bound_ratio": 0.0022,
                   "output_dir": "o"})
    out = capsys.readouterr().out
    assert "0.0022x of the bound" in out and "0.00x" not in out, out


def test_model_report_prints_small_ratios_with_significant_digits(tmp_path):
    from support import nets
    import onnx
    from xfc.model.pipeline import analyse
    from xfc.model.report import build_report, format_report
    path = tmp_path / "mlp.onnx"
    onnx.save(nets.mlp_net(), str(path))
    hw = load_hw("snapdragon-865")
    net, cov, syntheses, names = analyse(path, hw)
    report = build_report(net, cov, syntheses, names, hw=hw, cluster=None, threads=None)
    for layer in report["layers"]:
        layer["error_to_bound_ratio"] = 0.0022
    report["verification"] = {"verified": True, "verified_on": "host", "reference": "onnxruntime", "layers_checked": 2,
                              "layers_failed": [], "worst_layer_ratio": 0.0022, "ops_without_error_rule": [],
                              "outputs": [{"name": "y", "max_abs_error": 1e-9, "max_bound": 1e-6, "max_abs_output": 1.0,
                                           "error_to_bound_ratio": 0.0022, "bound_kind": "derived"}]}
    text = format_report(report)
    assert "0.00x" not in text, text
    assert "worst 0.0022x" in text and "(0.0022x of it" in text, text
    assert any(line.split()[-1] == "0.0022" for line in text.splitlines() if line.startswith(report["layers"][0]["node"]))


def test_hw_show_wraps_uncertain_values_text_only(capsys):
    """Text: the uncertain values in lines of at most 100 columns, each value whole and once;
    --json: the same list as before, one string per value."""
    import json
    hw = load_hw("snapdragon-865")
    assert len(", ".join(hw.uncertain)) > 200          # long enough to need wrapping
    code, out, err = run(["hw", "show", "snapdragon-865"], capsys)
    assert code == 0, err
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Uncertain values"))
    body = lines[start + 1:]
    assert body and all(len(line) <= 100 and line.startswith("  ") for line in body), body
    shown = [v.strip() for line in body for v in line.split(",") if v.strip()]
    assert shown == list(hw.uncertain)
    code, out, _ = run(["hw", "show", "snapdragon-865", "--json"], capsys)
    assert code == 0 and json.loads(out)["uncertain"] == list(hw.uncertain)
