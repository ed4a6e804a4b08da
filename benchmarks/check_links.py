"""The placement of EP ranks over the GPUs visible and the peer links between their GPUs, checked as
moepolicy's live paths check them before any rank starts (``moepolicy.measure.ranks``).

    python benchmarks/check_links.py EP

One line: the placement (exit 0), or the refusal naming the GPU pair (exit 5; 2 without GPUs).
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    from moepolicy.errors import MoePolicyError
    from moepolicy.measure.ranks import gpu_placement

    if len(argv) != 1 or not argv[0].isdigit() or int(argv[0]) < 1:
        print("usage: python benchmarks/check_links.py EP (a positive EP size)", file=sys.stderr)
        return 2
    ep = int(argv[0])
    try:
        placement = gpu_placement(ep)
    except MoePolicyError as exc:
        print(f"check_links: {exc}", file=sys.stderr)
        return exc.exit_code
    except ValueError as exc:  # no CUDA GPU visible
        print(f"check_links: {exc}", file=sys.stderr)
        return 2
    links = "no peer access needed" if placement.shared else "peer links ok"
    print(f"check_links: EP {ep}: {placement.describe()}; {links}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
