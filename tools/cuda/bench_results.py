#!/usr/bin/env python3
"""One line of a bench's JSON lines (ferrox bench's or llama-bench's, on
stdin): each test as its name, depth tagged ("pp512", "tg128@d4096"), and
its mean t/s; `--sd` adds the spread ("tg128 1013.1±1.2", one space apart),
without it two spaces apart ("pp512 98543.3  tg128@d4096 927.2"). Used by
scripts/cuda-dev.sh and scripts/cuda-side-by-side.sh."""
import json
import sys


def name(r):
    t = "pp%d" % r["n_prompt"] if r["n_prompt"] else "tg%d" % r["n_gen"]
    return t + ("@d%d" % r["n_depth"] if r.get("n_depth") else "")


def main():
    sd = "--sd" in sys.argv[1:]
    rs = [json.loads(l) for l in sys.stdin if l.strip()]
    if sd:
        print(" ".join("%s %.1f±%.1f" % (name(r), r["avg_ts"], r["stddev_ts"]) for r in rs))
    else:
        print("  ".join("%s %.1f" % (name(r), r["avg_ts"]) for r in rs), end="  " if rs else "")


main()
