"""The JSON lines of the local files: orjson when installed, the standard library otherwise,
the same JSON either way."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from otel_tunix.support import json_lines as _json


@pytest.fixture(params=["orjson", "stdlib"])
def encoder(request, monkeypatch):
    if request.param == "stdlib":
        monkeypatch.setattr(_json, "_fast_line", None)
    elif _json._fast_line is None:
        pytest.skip("orjson is not installed")
    return request.param


def test_both_encoders_write_the_same_json(encoder):
    obj = {
        "type": "step",
        "step": 3,
        "start_ns": 1_700_000_000_123_456_789,
        "busy_time_sec": 0.060123,
        "spans": [{"name": "für", "kind": "busy", "parent": None}],
        "np": np.float32(0.5),
        "obj": object,  # not JSON: written as its str()
    }
    line = _json.dumps_line(obj)
    assert "\n" not in line
    back = json.loads(line)
    assert back["start_ns"] == 1_700_000_000_123_456_789
    assert back["busy_time_sec"] == 0.060123 and back["np"] == 0.5
    assert back["spans"][0]["name"] == "für"
    assert back["obj"] == str(object)


def test_non_finite_values_are_written_as_json_extensions(encoder):
    line = _json.dumps_line({"loss": math.nan, "g": math.inf}, finite=False)
    back = json.loads(line)
    assert math.isnan(back["loss"]) and back["g"] == math.inf
    assert "NaN" in line and "Infinity" in line


def test_what_orjson_cannot_write_falls_back(encoder):
    obj = {1: "int key", "big": 2**70}
    assert json.loads(_json.dumps_line(obj)) == {"1": "int key", "big": 2**70}


def test_all_finite_ignores_non_floats():
    assert _json.all_finite([1.0, 2, "x", None])
    assert not _json.all_finite([1.0, math.nan])
    assert not _json.all_finite(["a", -math.inf])
