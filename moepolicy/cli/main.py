"""Entry point: parse, dispatch to a subcommand, turn every expected error into one stderr line."""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from moepolicy.errors import MoePolicyError, one_line

_COMMANDS = ("models", "plan", "explain", "audit", "validate", "export", "tune", "bench", "report")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, like every other usage error
        print(f"moepolicy: {one_line(message)} (see 'moepolicy {self.prog.split()[-1]} --help')"
              if " " in self.prog else f"moepolicy: {one_line(message)}", file=sys.stderr)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = _Parser(prog="moepolicy", description=(
        "Decide, per MoE layer, whether activations are quantized before or after DeepEP dispatch; "
        "tune DeepEP; emit a policy the serving runtime loads."))
    from moepolicy._version import __version__

    parser.add_argument("--version", action="version", version=f"moepolicy {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in _COMMANDS:
        importlib.import_module(f"moepolicy.cli.{name}").add_parser(sub)
    return parser


# library field names whose flag is not the field's name with dashes
_FLAGS = {"options": "--opt-in"}


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled as Ctrl-C is: work in progress is ended cleanly (a tune writes what it has)."""


def _terminate_as_interrupt() -> None:
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return

    def handler(signum, frame):
        raise Terminated()

    signal.signal(signal.SIGTERM, handler)


def flag_words(exc: MoePolicyError) -> str:
    """The error's one line, its leading field name (``ep_size``) said as the flag (``--ep-size``)."""
    message = one_line(str(exc))
    field = getattr(exc, "field", None)
    if field and message.startswith(field):
        return _FLAGS.get(field, "--" + field.replace("_", "-")) + message[len(field):]
    return message


def main(argv: Optional[Sequence[str]] = None, *, bench_source=None) -> int:
    """Run one command. ``bench_source`` (a ``tuning.bench_source.BenchSource``) replaces where
    ``tune`` gets its measurements (tests inject fakes here)."""
    _terminate_as_interrupt()  # first: a SIGTERM while the commands load is handled as Ctrl-C is
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM before the command started: nothing to keep
        print(f"moepolicy: {'terminated' if isinstance(exc, Terminated) else 'interrupted'}", file=sys.stderr)
        return 143 if isinstance(exc, Terminated) else 130
    from moepolicy.cli._output import SafeStream

    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = SafeStream(sys.stdout), SafeStream(sys.stderr)
    try:
        return _run(args, bench_source)
    finally:
        sys.stdout, sys.stderr = saved


def _run(args: argparse.Namespace, bench_source) -> int:
    try:
        code = int(args.run(args, bench_source) if args.command == "tune" else args.run(args) or 0)
        sys.stdout.flush()
        return code
    except MoePolicyError as exc:
        print(f"moepolicy: {flag_words(exc)}", file=sys.stderr)
        return exc.exit_code
    except Terminated:
        print("moepolicy: terminated", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("moepolicy: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        _silence_stdout()
        return 0
    except OSError as exc:  # standard output on a full disk or a closed descriptor
        _silence_stdout()
        print(f"moepolicy: cannot write to standard output ({exc.strerror or exc})", file=sys.stderr)
        return 1


def _silence_stdout() -> None:
    """Point standard output at /dev/null so that the interpreter's last flush cannot fail again."""
    import os

    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.__stdout__.fileno())
    except (OSError, AttributeError, ValueError):
        pass


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
