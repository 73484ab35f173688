"""Counts of the device check's test runs, from their JUnit XML files, as one JSON object:
{"ctest": {...}, "pytest": {...}}, each with tests/passed/failed/skipped, the failures' names
and every skip's reason (a GPU test that skips on the GPU machine is a finding).

    python scripts/gpu/junit_summary.py CTEST_XML PYTEST_XML
"""

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def skip_reason(case, skipped):
    """pytest's skip message; for ctest, which only says that its skip pattern matched, the
    line after gtest's "Skipped" in the test's output."""
    reason = skipped.get("message") or skipped.text or ""
    output = case.findtext("system-out") or ""
    if reason.startswith("SKIP_REGULAR_EXPRESSION") and "Skipped" in output:
        after = output.split("Skipped", 1)[1].strip().splitlines()
        reason = after[0] if after else reason
    return reason


def summary(path):
    if not Path(path).exists():
        return {"error": f"{path} was not written"}
    counts = {"tests": 0, "passed": 0, "failed": 0, "skipped": 0, "failures": [], "skips": []}
    for case in ET.parse(path).getroot().iter("testcase"):
        parts = [case.get("classname"), case.get("name")]
        name = ".".join(dict.fromkeys(filter(None, parts)))  # ctest repeats the name
        counts["tests"] += 1
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        skipped = case.find("skipped")
        if failure is not None:
            counts["failed"] += 1
            counts["failures"].append(
                {"test": name, "message": (failure.get("message") or "")[:500]})
        elif skipped is not None and case.get("status") != "run":
            counts["skipped"] += 1
            counts["skips"].append({"test": name, "reason": skip_reason(case, skipped)[:300]})
        else:
            counts["passed"] += 1
    return counts


print(json.dumps({"ctest": summary(sys.argv[1]), "pytest": summary(sys.argv[2])}))
