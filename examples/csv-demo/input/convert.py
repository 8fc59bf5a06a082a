"""Converts sales.csv to a JSON summary per region: the script an agent is asked to fix.

Known bugs for the agent to find: empty `units` crash int(), and prices with a thousands
separator crash float(). The sandbox lets it run and test this safely: the input is read-only,
only /workspace/output is collected, there is no network and no secret.
"""
import csv
import json
import sys


def convert(source, target, lenient=False):
    totals = {}
    with open(source, newline="") as f:
        for row in csv.DictReader(f):
            units_text = row["units"].strip()
            price_text = row["unit_price"].strip()
            if lenient:
                units_text = units_text or "0"
                price_text = price_text.replace(",", "")
            units = int(units_text)
            price = float(price_text)
            region = totals.setdefault(row["region"], {"units": 0, "revenue": 0.0})
            region["units"] += units
            region["revenue"] = round(region["revenue"] + units * price, 2)
    with open(target, "w") as f:
        json.dump(totals, f, indent=2, sort_keys=True)
    return totals


if __name__ == "__main__":
    lenient = "--lenient" in sys.argv
    args = [a for a in sys.argv[1:] if a != "--lenient"]
    print(json.dumps(convert(args[0], args[1], lenient), sort_keys=True))
