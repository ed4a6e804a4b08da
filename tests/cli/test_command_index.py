"""The command index: ``moepolicy --version``, ``--help`` and a usage error import no command; the
index's help for each command is the command's own."""

import subprocess
import sys

import pytest

from moepolicy.cli import main as cli_main


def _imported_after(args: list[str]) -> set[str]:
    script = (
        "import sys\n"
        "from moepolicy.cli.main import main\n"
        "try:\n"
        f"    main({args!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('MODULES:', ' '.join(m for m in sys.modules"
        " if m.startswith(('moepolicy', 'optuna', 'pydantic'))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    return set(out.stdout.split("MODULES:")[-1].split())


@pytest.mark.parametrize("args", [["--version"], ["--help"], ["no-such-command"]])
def test_the_index_imports_no_command_nor_the_planner(args):
    loaded = _imported_after(args)
    assert not {
        m for m in loaded if m.startswith("moepolicy.cli.") and m[14:] in cli_main._COMMANDS
    }
    assert "moepolicy.planner" not in loaded and "moepolicy.checkpoint" not in loaded
    assert not {m for m in loaded if m.startswith(("optuna", "pydantic"))}


def test_a_command_imports_its_own_module_only():
    loaded = _imported_after(["doctor", "--help"])
    commands = {m[14:] for m in loaded if m.startswith("moepolicy.cli.")} & set(cli_main._COMMANDS)
    assert commands == {"doctor"}


def test_each_commands_help_is_the_index_entry():
    parser = cli_main.build_parser()  # every command built in full
    sub = next(
        a for a in parser._actions if isinstance(a, type(parser._subparsers._group_actions[0]))
    )
    own = {choice.dest: choice.help for choice in sub._choices_actions}
    assert own == cli_main._COMMANDS
