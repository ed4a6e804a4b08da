"""Entry point: parse, dispatch to a subcommand, turn every expected error into one stderr line."""

from __future__ import annotations

import argparse
import signal as _signal
import sys
from typing import NoReturn, Optional, Sequence

from moepolicy import errors
from moepolicy._version import __version__
from moepolicy.errors import MoePolicyError, OutputError, one_line

# name -> one-line help: the command index (as optuna's CLI keeps one). Only the command run is
# imported; --version, --help and a usage error import none (tests/cli: each module's own help is
# this one).
_COMMANDS = {
    "models": "list the built-in catalog of MoE checkpoints",
    "plan": "decide quant-before/after dispatch per layer; write the policy",
    "explain": "why a layer got its order: every rule considered",
    "audit": "group layers by decision; count the fallbacks and their reasons",
    "validate": "check a policy: schema, version, DeepEP rules, key integrity",
    "export": "the vLLM plugin launch, or SGLang's --deepep-config JSON or launch command",
    "tune": "tune DeepEP (optuna, live or modelled) and write the policy",
    "studies": "list the tunes' optuna studies in a storage, or delete one",
    "bench": "time the MoE step with the policy vs vLLM's choices vs DeepEP's defaults",
    "report": "draw the policy's tuning evidence (SM scan, kept vs defaults, orders, overlap)",
    "doctor": "what this node has: the DeepEP build's APIs (the --deep-ep-version to plan with), "
    "the vLLM release and whether the plugin supports it, the GPUs",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2, like every other usage error
        from moepolicy.text import printable

        # the message quotes what was typed (unrecognized arguments, an invalid choice): escaped as
        # every other message is (argparse runs before the escaping streams are in place)
        message = printable(one_line(message), one_line=True) + _did_you_mean(message)
        print(
            f"moepolicy: {message} (see 'moepolicy {self.prog.split()[-1]} --help')"
            if " " in self.prog
            else f"moepolicy: {message}",
            file=sys.stderr,
        )
        raise SystemExit(2)

    def parse_known_args(self, args=None, namespace=None):
        if self._subparsers is None:  # a command's own words (the index's are the command name)
            self._refuse_unknown_flag(sys.argv[1:] if args is None else list(args))
        return super().parse_known_args(args, namespace)

    def _refuse_unknown_flag(self, words: list[str]) -> None:
        """A mistyped flag (``--modle``) is named with the closest real one, before argparse would
        report a required flag as missing instead (it checks that first) or say nothing of a
        suggestion."""
        import difflib

        known = [flag for flag in self._option_string_actions if flag.startswith("--")]
        for word in words:
            if word == "--":
                return
            typed = word.split("=", 1)[0]
            if not typed.startswith("--") or any(flag.startswith(typed) for flag in known):
                continue  # a value, or a flag or its unambiguous start (argparse takes those)
            # compared without the dashes every flag shares: --model is not close to --help
            close = difflib.get_close_matches(typed[2:], [flag[2:] for flag in known], n=1)
            self.error(
                f"unknown flag {typed}"
                + (f": did you mean --{close[0]}?" if close else self._reads())
            )

    def _reads(self) -> str:
        """For a command that reads a policy file (``moepolicy bench --model M``): what it reads."""
        if not any(action.dest == "policy" for action in self._positionals._group_actions):
            return ""
        command = self.prog.split()[-1]
        return (
            f": 'moepolicy {command}' reads a policy file (moepolicy {command} POLICY), which "
            "'moepolicy tune --model MODEL -o POLICY' writes"
        )


def _did_you_mean(message: str) -> str:
    """ " (did you mean 'plan'?)" for a mistyped command."""
    import difflib
    import re

    typed = re.search(r"invalid choice: '([^']*)'", message)
    if not typed or "COMMAND" not in message:
        return ""
    close = difflib.get_close_matches(typed.group(1), _COMMANDS, n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _command_in(argv: Optional[Sequence[str]]) -> Optional[str]:
    """The command ``argv`` runs: its first word that is not an option, where it names one."""
    for word in argv or ():
        if not word.startswith("-"):
            return word if word in _COMMANDS else None
    return None


def build_parser(argv: Optional[Sequence[str]] = None) -> argparse.ArgumentParser:
    """The parser; with ``argv``, only the command it runs is imported and built in full (the others
    are listed by name and help), with ``argv=None`` every command is."""
    import importlib

    from moepolicy.cli import _logging  # after main's signal handlers, as the commands are

    parser = _Parser(
        prog="moepolicy",
        description=(
            "Decide, per MoE layer, whether activations are quantized before or after DeepEP dispatch; "
            "tune DeepEP; emit a policy the serving runtime loads."
        ),
        epilog=exit_codes(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"moepolicy {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    chosen = _command_in(argv) if argv is not None else None
    for name, help_text in _COMMANDS.items():
        if argv is None or name == chosen:
            importlib.import_module(f"moepolicy.cli.{name}").add_parser(sub)
        else:
            sub.add_parser(name, help=help_text, add_help=False)
    for command in sub.choices.values():
        _logging.add_flags(command)
        command.epilog = command.epilog or "exit codes: see 'moepolicy --help'"
        command.formatter_class = argparse.RawDescriptionHelpFormatter
    return parser


def exit_codes() -> str:
    """The exit codes, from the error classes (one home)."""
    leaves = sorted(
        {
            cls.exit_code: cls
            for cls in vars(errors).values()
            if isinstance(cls, type) and issubclass(cls, errors.MoePolicyError)
        }.items()
    )
    lines = ["exit codes: 0 done", "  1 any other error moepolicy names (in one line)"]
    lines += [
        f"  {code} {(cls.__doc__ or cls.__name__).strip().splitlines()[0].rstrip('.')}"
        for code, cls in leaves
        if cls is not errors.MoePolicyError
    ]
    lines += ["  130 interrupted (Ctrl-C), 143 terminated (SIGTERM), 129 hung up (SIGHUP)"]
    return "\n".join(lines)


# library field names whose flag is not the field's name with dashes
_FLAGS = {"options": "--opt-in"}


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT), raised by the CLI's own handler rather than Python's.

    Python's handler raises a plain ``KeyboardInterrupt``; when one escapes code run by ``exec`` (as
    ``dataclasses`` does while the commands import), CPython marks the interpreter to end by SIGINT
    at exit, even after the CLI caught the interrupt and returned 130. CPython checks the exact type,
    so a subclass keeps the exit code the CLI chose.
    """


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled as Ctrl-C is: work in progress is ended cleanly (a tune writes what it has)."""


class HungUp(Terminated):
    """SIGHUP (the terminal or the ssh session closed), handled as SIGTERM is."""


_RECEIVED: list[int] = []  # the signals this process's handlers received, first first
# the exception each handled signal raises (SIGHUP where the platform has it)
_EXCEPTION_OF: dict[int, type[BaseException]] = {
    _signal.SIGINT: Interrupted,
    _signal.SIGTERM: Terminated,
    **({_signal.SIGHUP: HungUp} if hasattr(_signal, "SIGHUP") else {}),
}


def install_signal_handlers() -> None:
    """Ctrl-C and SIGTERM raise :class:`Interrupted` / :class:`Terminated` from here on (main thread)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    _RECEIVED.clear()  # a new command (tests run several in one process)
    output = sys.modules.get("moepolicy.cli._output")
    if output is not None:
        output.WRITTEN.clear()
    _HELD_SINCE.clear()
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, _on_signal)
    sys.unraisablehook = _on_unraisable


# An interrupt that lands while a module imports is held until the import is done, then sent again:
# raised inside an import (a compiled extension's initialisation, as numpy.random's when optuna's
# sampler first draws) it can be turned into another error that some caller catches, and the command
# would go on as if never interrupted. Held at most this long, so a hung import still ends.
HOLD_DURING_IMPORT_S = 2.0
_HELD_SINCE: dict[int, float] = {}


def _importing(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
            return True
        frame = frame.f_back
    return False


def _on_signal(signum: int, frame) -> None:
    import signal
    import threading
    import time

    if signum not in _HELD_SINCE:
        _RECEIVED.append(signum)
    first = _HELD_SINCE.setdefault(signum, time.monotonic())
    if _importing(frame) and time.monotonic() - first < HOLD_DURING_IMPORT_S:
        again = threading.Timer(
            0.02, signal.pthread_kill, args=(threading.main_thread().ident, signum)
        )
        again.daemon = True
        again.start()
        return
    _HELD_SINCE.pop(signum, None)
    raise _EXCEPTION_OF.get(signum, Interrupted)()


def _on_unraisable(event) -> None:
    """An interrupt that landed in a weakref callback or a ``__del__`` (where Python cannot raise: it
    prints the exception and goes on) is sent again, from another thread once this hook has
    returned, so that it lands in the command's own code."""
    import signal
    import threading

    if not isinstance(event.exc_value, KeyboardInterrupt):
        sys.__unraisablehook__(event)
        return
    again = next(
        (s for s, kind in _EXCEPTION_OF.items() if type(event.exc_value) is kind), signal.SIGINT
    )
    # to the main thread itself: a signal for the process could land on this timer's thread
    main = threading.main_thread().ident
    resend = threading.Timer(0.01, signal.pthread_kill, args=(main, again))
    resend.daemon = True
    resend.start()


def interrupt_exit(exc: BaseException) -> Optional[int]:
    """For Ctrl-C or SIGTERM, one line on stderr and the shell's exit code (130 or 143); None for
    anything else. An interrupt that lands while a module imports can surface as another exception
    (a RuntimeError from a class being built, an ImportError, a panic in a compiled extension), so
    once a signal was received any exception ends as that interrupt."""
    import signal

    if isinstance(exc, SystemExit) or not (_RECEIVED or isinstance(exc, KeyboardInterrupt)):
        return None
    outcome = getattr(exc, "moepolicy_outcome", None) or _written()  # what the command left behind
    hung_up = isinstance(exc, HungUp) or _RECEIVED[:1] == [getattr(signal, "SIGHUP", None)]
    if hung_up:
        print(f"moepolicy: hung up{outcome}", file=sys.stderr)
        return 129
    terminated = isinstance(exc, Terminated) or (_RECEIVED[:1] == [signal.SIGTERM])
    said = "terminated" if terminated else "interrupted"
    print(f"moepolicy: {said}{outcome}", file=sys.stderr)
    return 143 if terminated else 130


def _written() -> str:
    """' after writing FILE (...): ...' where the command had written its output when the signal
    came (still the shell's code for the signal: the user asked to stop, so what follows in a
    script does not run), else ''."""
    output = sys.modules.get("moepolicy.cli._output")  # never imported here: nothing written yet
    written = getattr(output, "WRITTEN", None)
    if not written:
        return ""
    return (
        f" after writing {written[-1]}; that file is whole (the signal came after it was written)"
    )


def flag_words(exc: MoePolicyError) -> str:
    """The error's one line, its leading field name (``ep_size``) said as the flag (``--ep-size``)."""
    message = one_line(str(exc))
    field = getattr(exc, "field", None)
    if field and message.startswith(field):
        from moepolicy.tuning.options import flag

        said = _FLAGS.get(field) or flag(field)
        rest = message[len(field) :]
        named = f" ({said})"  # the library names the flag beside the option: once is enough here
        return said + (rest[len(named) :] if rest.startswith(named) else rest)
    return message


def main(argv: Optional[Sequence[str]] = None, *, bench_source=None) -> int:
    """Run one command. ``bench_source`` (a ``tuning.bench_source.BenchSource``) replaces where
    ``tune`` gets its measurements (tests inject fakes here)."""
    install_signal_handlers()  # first: an interrupt while the commands load ends in one line too
    try:
        from moepolicy.cli import _logging

        _logging.log_to_stderr()
        words = list(sys.argv[1:] if argv is None else argv)
        parser = build_parser(words)
        args = parser.parse_args(words)
        from moepolicy.cli._output import SafeStream
    except BaseException as exc:  # noqa: BLE001 (Ctrl-C or SIGTERM before the command started)
        code = interrupt_exit(exc)
        if code is None:
            raise
        return code
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = SafeStream(sys.stdout), SafeStream(sys.stderr, "standard error")
    try:
        return _run(args, bench_source)
    finally:
        sys.stdout, sys.stderr = saved


def _run(args: argparse.Namespace, bench_source) -> int:
    from moepolicy.cli import _logging

    try:
        if getattr(args, "log_file", None):  # never an input, and a file (a FIFO would hang)
            from moepolicy.cli._output import command_inputs, output_path

            try:
                output_path(args.log_file, command_inputs(args), flag="--log-file", what="the log")
            except OutputError as exc:
                said = str(exc)
                raise OutputError(
                    said if said.startswith("--log-file") else f"--log-file {said}",
                    field="log_file",
                ) from None
        _logging.configure(args)
        code = int(args.run(args, bench_source) if args.command == "tune" else args.run(args) or 0)
        sys.stdout.flush()
        return code
    except BaseException as exc:  # noqa: BLE001 (each expected kind ends in one line; others re-raised)
        interrupted = interrupt_exit(exc)
        if interrupted is not None:
            return interrupted
        if isinstance(exc, MoePolicyError):
            print(f"moepolicy: {flag_words(exc)}", file=sys.stderr)
            return exc.exit_code
        if isinstance(exc, BrokenPipeError):
            _silence_stdout()
            return 0
        # what really failed: standard output (a full disk, a closed descriptor), or a file a
        # command used
        if isinstance(exc, OSError):
            from moepolicy.cli._output import os_error_line

            if getattr(exc, "moepolicy_stream", None) == "standard output":
                _silence_stdout()
            if getattr(exc, "moepolicy_stream", None) != "standard error":
                print(f"moepolicy: {one_line(os_error_line(exc))}", file=sys.stderr)
            return 1
        raise


def _silence_stdout() -> None:
    """Point standard output at /dev/null so that the interpreter's last flush cannot fail again."""
    import os

    try:
        if sys.__stdout__ is not None:  # None: the process has no standard output at all
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.__stdout__.fileno())
    except (OSError, AttributeError, ValueError):
        pass


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
