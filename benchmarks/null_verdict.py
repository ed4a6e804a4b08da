"""The null check's verdict: ``moepolicy bench`` of a policy planned with vLLM's own rules times three
arms with the same settings, so any 'faster' or 'slower' among its comparisons is a false claim.

    python benchmarks/null_verdict.py NULL.json      # bench's -o output

One line; exit 0 when nothing is claimed (or nothing was compared: a functional run), 1 otherwise.
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python benchmarks/null_verdict.py NULL.json", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        rows = json.load(f)["comparison"]
    if not rows:
        print(
            "null check: a functional run: nothing was compared (no times are compared where ranks share a GPU)"
        )
        return 0
    verdicts = [
        (row["routing"], row["tokens"], base, row[key]["verdict"])
        for row in rows
        for key, base in (("vs_vllm", "vllm"), ("vs_deepep-default", "deepep-default"))
    ]
    claims = [v for v in verdicts if v[3] in ("faster", "slower")]
    if claims:
        said = ", ".join(f"{r} T={t} vs {b}: {v}" for r, t, b, v in claims)
        print(
            f"null check: FAILED: {len(claims)} of {len(verdicts)} comparisons of identical arms claimed ({said})"
        )
        return 1
    print(
        f"null check: ok: none of {len(verdicts)} comparisons of identical arms claimed a difference"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
