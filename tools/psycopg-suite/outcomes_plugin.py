"""pytest plugin: write each test's final outcome and error as JSON lines to $OUTCOMES_FILE."""
import json
import os
import time

_results = {}


def _message(report):
    lr = report.longrepr
    if lr is None:
        return ""
    if isinstance(lr, tuple):  # skip: (path, lineno, reason)
        return str(lr[2])
    crash = getattr(lr, "reprcrash", None)
    if crash is not None and crash.message:
        return crash.message
    return str(lr)[-800:]


def pytest_runtest_logreport(report):
    r = _results.setdefault(report.nodeid, {"nodeid": report.nodeid, "outcome": None, "when": None, "message": "", "duration": 0.0, "start": time.time(),
                                                 "timing": "timing" in report.keywords})
    r["duration"] += getattr(report, "duration", 0.0) or 0.0
    if report.failed:
        if r["outcome"] not in ("failed", "error"):
            r["outcome"] = "failed" if report.when == "call" else "error"
            r["when"] = report.when
            r["message"] = _message(report)
            # the whole representation, for the report (tail only)
            r["longrepr"] = str(report.longrepr)[-3000:]
    elif report.skipped:
        if r["outcome"] is None:
            xfail = hasattr(report, "wasxfail")
            r["outcome"] = "xfailed" if xfail else "skipped"
            r["when"] = report.when
            r["message"] = report.wasxfail if xfail else _message(report)
    elif report.passed and report.when == "call":
        if r["outcome"] is None:
            r["outcome"] = "xpassed" if hasattr(report, "wasxfail") else "passed"
    if report.when == "teardown":
        # the last report of a test: write it now, so a run cut short keeps what it did
        if r["outcome"] is None:
            r["outcome"] = "unknown"
        path = os.environ.get("OUTCOMES_FILE")
        if path:
            with open(path, "a") as f:
                f.write(json.dumps(_results.pop(report.nodeid)) + "\n")
