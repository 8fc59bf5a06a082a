"""Tests for convert.py, run inside the sandbox under a time limit."""
import json
import os
import sys

sys.path.insert(0, "/input")
from convert import convert  # noqa: E402

out = "/workspace/output/sales.json"
os.makedirs("/workspace/output", exist_ok=True)
totals = convert("/input/sales.csv", out, lenient=True)
assert totals["north"] == {"units": 13, "revenue": 40.0}, totals["north"]
assert totals["east"] == {"units": 11, "revenue": 4817.5}, totals["east"]
assert totals["south"]["units"] == 3, totals["south"]
with open(out) as f:
    assert json.load(f) == totals
print("3 checks passed")
