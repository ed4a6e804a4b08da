"""``python -m moepolicy.testing.cli [--fake-deepep N] [--model-bench-delay S] -- ARGS``: the real
``moepolicy`` command line with a test bench source injected (for tests that run the CLI in a
process of its own, to interrupt or kill it)."""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence


def main(argv: Optional[Sequence[str]] = None) -> int:
    from moepolicy.cli.main import install_signal_handlers, interrupt_exit, main as cli_main

    install_signal_handlers()  # before the fakes import, as the real CLI does before its commands load
    try:
        argv = list(sys.argv[1:] if argv is None else argv)
        split = argv.index("--") if "--" in argv else len(argv)
        p = argparse.ArgumentParser(prog="moepolicy.testing.cli")
        p.add_argument(
            "--fake-deepep", type=int, default=0, help="fake DeepEP ranks for --bench live"
        )
        p.add_argument(
            "--model-bench-delay",
            type=float,
            default=0.0,
            help="seconds per model-bench measurement",
        )
        own = p.parse_args(argv[:split])
        from moepolicy.testing.fakes import FakeBenchSource

        source = FakeBenchSource(fake_ranks=own.fake_deepep, model_delay_s=own.model_bench_delay)
    except BaseException as exc:  # noqa: BLE001 (Ctrl-C or SIGTERM while the fakes load)
        code = interrupt_exit(exc)
        if code is None:
            raise
        return code
    return cli_main(argv[split + 1 :], bench_source=source)


if __name__ == "__main__":
    sys.exit(main())
