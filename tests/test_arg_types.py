"""argparse `type=` functions (xfc/cli/arg_types.py): the range each accepts, and a refusal that
names the value as typed, which xfc's parser prints as one line, exit 2."""
from __future__ import annotations

import argparse

import pytest

from xfc.cli.arg_types import non_negative_int, positive_float, positive_int, tcp_port

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("function, good, bad, words", [
    (tcp_port, {"1": 1, "6379": 6379, "65535": 65535},
     ["0", "65536", "99999", "-1", "x", "", "6379.0"], "must be a TCP port 1-65535"),
    (positive_int, {"1": 1, "64": 64, " 3 ": 3},
     ["0", "-1", "1.5", "one", ""], "must be an integer >= 1"),
    (non_negative_int, {"0": 0, "7": 7},
     ["-1", "-0.5", "2.0", "x"], "must be an integer >= 0"),
    (positive_float, {"0.25": 0.25, "3": 3.0, "1e3": 1000.0},
     ["0", "-0.5", "nan", "inf", "-inf", "x", ""], "must be a number > 0"),
])
def test_accepts_its_range_and_names_the_refused_value(function, good, bad, words):
    for text, value in good.items():
        got = function(text)
        assert got == value and type(got) is type(value), (text, got)
    for text in bad:
        with pytest.raises(argparse.ArgumentTypeError) as refused:
            function(text)
        assert str(refused.value) == f"{words}, got {text!r}"


def test_a_parser_prints_the_option_and_the_value():
    parser = argparse.ArgumentParser(prog="p", exit_on_error=False)
    parser.add_argument("--port", type=tcp_port)
    assert parser.parse_args(["--port", "80"]).port == 80
    with pytest.raises(argparse.ArgumentError, match=r"argument --port: must be a TCP port 1-65535, got '99999'"):
        parser.parse_args(["--port", "99999"])
