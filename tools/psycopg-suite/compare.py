"""Compare two outcome files (outcomes_plugin.py): direct vs through the fencepost SQL endpoint.

  compare.py DIRECT.jsonl ENDPOINT.jsonl                      the comparison
  compare.py DIRECT.jsonl ENDPOINT.jsonl --list-regressions   node ids that pass direct and fail
                                                              through the endpoint (expected ones left out)
  compare.py DIRECT.jsonl ENDPOINT.jsonl --reruns DIR         the comparison, with the failure rates of
                                                              DIR/rerun-{direct,endpoint}-*.jsonl per regression
"""
import glob
import json
import re
import sys
from collections import Counter, defaultdict

BAD = ("failed", "error", "unknown")

EXPECTED = [
    # (label, predicate on nodeid): differences that are expected, listed apart
    ("two-phase commit (the endpoint refuses PREPARE TRANSACTION on purpose)",
     lambda n: "test_tpc" in n or "tpc" in n.split("::")[-1].lower()),
]


def load(path):
    out = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                r = json.loads(line)
                out[r["nodeid"]] = r
    return out


def norm(msg):
    first = (msg or "").strip().splitlines()[0] if (msg or "").strip() else "(no message)"
    first = re.sub(r"0x[0-9a-f]+", "0x…", first)
    first = re.sub(r"\d+", "#", first)
    return first[:300]


def counts(res):
    c = Counter(r["outcome"] for r in res.values())
    return {k: c.get(k, 0) for k in ("passed", "failed", "error", "skipped", "xfailed", "xpassed", "unknown")}


def expected_label(n):
    for label, pred in EXPECTED:
        if pred(n):
            return label
    return None


def regressions(d, e):
    return {n: e[n] for n in d if d[n]["outcome"] in ("passed", "xfailed") and n in e and e[n]["outcome"] in BAD}


def rerun_rates(rerun_dir):
    """{nodeid: (direct_failures, direct_runs, endpoint_failures, endpoint_runs)}"""
    rates = defaultdict(lambda: [0, 0, 0, 0])
    for side, at in (("direct", 0), ("endpoint", 2)):
        for path in sorted(glob.glob(f"{rerun_dir}/rerun-{side}-*.jsonl")):
            for n, r in load(path).items():
                rates[n][at + 1] += 1
                if r["outcome"] in BAD:
                    rates[n][at] += 1
    return rates


def main(argv):
    direct_path, endpoint_path = argv[1], argv[2]
    d, e = load(direct_path), load(endpoint_path)
    regs = regressions(d, e)
    if "--list-regressions" in argv:
        for n in sorted(regs):
            if expected_label(n) is None:
                print(n)
        return 0
    rates = rerun_rates(argv[argv.index("--reruns") + 1]) if "--reruns" in argv else {}

    print("== counts")
    print(f"{'':10} " + " ".join(f"{k:>8}" for k in counts(d)))
    for name, res in (("direct", d), ("endpoint", e)):
        print(f"{name:10} " + " ".join(f"{v:>8}" for v in counts(res).values()) + f"   total {len(res)}")

    expected, unexpected = defaultdict(list), {}
    for n, r in regs.items():
        label = expected_label(n)
        if label is not None:
            expected[label].append(n)
        else:
            unexpected[n] = r
    print(f"\n== pass direct, fail through the endpoint: {len(regs)} ({sum(map(len, expected.values()))} expected, {len(unexpected)} not)")
    for label, ns in expected.items():
        print(f"\n-- expected: {label}: {len(ns)}")
        for n in sorted(ns):
            print(f"   {n}: {norm(e[n]['message'])}")

    def show(title, items):
        groups = defaultdict(list)
        for n, r in items.items():
            groups[norm(r["message"])].append(n)
        if items:
            print(f"\n{title}: {len(items)}")
        for msg, ns in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            print(f"\n-- {len(ns)} × {msg}")
            for n in sorted(ns):
                extra = ""
                if n in rates:
                    df, dn, ef, en = rates[n]
                    extra = f"  reruns: direct failed {df}/{dn}, endpoint failed {ef}/{en}"
                print(f"   {n}  [{e[n]['outcome']} in {e[n]['when']}]{extra}")

    timing = {n: r for n, r in unexpected.items() if r.get("timing") or n.startswith("tests/pool/")}
    other = {n: r for n, r in unexpected.items() if n not in timing}
    show("== not timing-based", other)
    show("== timing-based (psycopg's `timing` mark, or the pool's timing-sensitive tests): compare their rerun rates", timing)

    both = [n for n in d if d[n]["outcome"] in BAD and n in e and e[n]["outcome"] in BAD]
    only_skipped_endpoint = [n for n in d if d[n]["outcome"] == "passed" and n in e and e[n]["outcome"] == "skipped"]
    fixed = [n for n in d if d[n]["outcome"] in BAD and n in e and e[n]["outcome"] == "passed"]
    missing = [n for n in d if n not in e]
    print(f"\n== passed direct, skipped through the endpoint: {len(only_skipped_endpoint)}")
    for n in sorted(only_skipped_endpoint):
        print(f"   {n}: {norm(e[n]['message'])}")
    print(f"\n== fail both ways: {len(both)}")
    for n in sorted(both):
        print(f"   {n}\n      direct:   {norm(d[n]['message'])}\n      endpoint: {norm(e[n]['message'])}")
    print(f"\n== fail direct, pass through the endpoint: {len(fixed)}")
    for n in sorted(fixed):
        print(f"   {n}: {norm(d[n]['message'])}")
    if missing:
        print(f"\n== ran direct, not through the endpoint (run cut short?): {len(missing)}")
        for n in sorted(missing)[:50]:
            print(f"   {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
