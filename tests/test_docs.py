"""Every `moepolicy ...` command line in the docs' ```bash blocks parses with the current CLI: a flag
renamed or removed in the code fails here, not in a reader's terminal. Parsing only: nothing runs.
And every test the docs cite (`tests/...py::test_name`) exists."""

import re
import shlex
from pathlib import Path

import pytest

from moepolicy.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
VERBATIM = {"DEEPEP_FACTS.md"}  # the copied DeepEP measurement notes: they cite DeepEP's own tests
SHELL_OPERATORS = {"|", "||", "&&", ";", "&", ">", ">>", "<", "2>", "2>&1"}


def bash_lines(text: str) -> list[str]:
    """The lines of every ```bash block, with backslash continuations joined."""
    lines, block, pending = [], False, ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("```"):
            block = stripped == "```bash" if not block else False
            pending = ""
            continue
        if not block:
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1].rstrip() + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    return lines


def moepolicy_commands(line: str) -> list[list[str]]:
    """The argument lists given to moepolicy on one shell line (``moepolicy``, ``.../bin/moepolicy`` or
    ``-m moepolicy``), each up to the next shell operator; comments dropped."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|<>")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    words = list(lexer)
    found = []
    for i, word in enumerate(words):
        if word.rsplit("/", 1)[-1] != "moepolicy" or (i > 0 and words[i - 1] in ("install", "-q")):
            continue  # not the CLI, or `pip install moepolicy`
        args = []
        for arg in words[i + 1 :]:
            if arg in SHELL_OPERATORS:
                break
            args.append(arg)
        found.append(args)
    return found


def documented_commands() -> list[tuple[str, list[str]]]:
    out = []
    for doc in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        for line in bash_lines(doc.read_text()):
            out.extend((f"{doc.name}: {line}", args) for args in moepolicy_commands(line))
    return out


COMMANDS = documented_commands()


def test_the_docs_hold_commands_to_check():
    assert len(COMMANDS) >= 6, COMMANDS  # the extraction itself works
    assert {args[0] for _, args in COMMANDS if args} >= {"tune", "validate", "export"}


@pytest.mark.parametrize("where, args", COMMANDS, ids=[w[:80] for w, _ in COMMANDS])
def test_every_documented_command_line_parses(where, args, capsys):
    parser = build_parser()
    try:
        parser.parse_args(args)
    except SystemExit as exc:
        assert exc.code == 0, f"{where}\n{capsys.readouterr().err.strip()}"


def test_a_stale_flag_is_caught():
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(moepolicy_commands("moepolicy report p.yaml --no-such-flag")[0])
    assert exc.value.code == 2
    assert moepolicy_commands(
        "torchrun --nnodes 2 -m moepolicy tune --bench live | tee log # note"
    ) == [["tune", "--bench", "live"]]
    assert bash_lines("```bash\nmoepolicy plan \\\n  --model m\n```\n") == [
        "moepolicy plan --model m"
    ]


def cited_tests(text: str) -> list[tuple[str, str]]:
    """(file, test name) for each `tests/....py::name` cited; a bare `::name` is in the last file named
    earlier on the same line. A file cited alone is returned with an empty name."""
    out = []
    for line in text.splitlines():
        last = None
        for match in re.finditer(r"`(tests/[\w/]+\.py)?(?:::(\w+))?", line):
            path, name = match.groups()
            last = path or last
            if path or name:
                out.append((last or "", name or ""))
    return out


def test_every_test_the_docs_cite_exists():
    missing = []
    for doc in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        if doc.name in VERBATIM:
            continue
        for path, name in cited_tests(doc.read_text()):
            source = ROOT / path if path else None
            if source is None or not source.is_file():
                missing.append(f"{doc.name}: {path or '(no file)'}::{name}")
            elif name and not re.search(
                rf"^(async )?def {name}\(", source.read_text(), re.MULTILINE
            ):
                missing.append(f"{doc.name}: {path}::{name}")
    assert not missing, missing


def test_a_stale_citation_is_caught():
    assert cited_tests("`tests/cli/test_outputs.py::test_a`, `::test_b`; `tests/x.py`") == [
        ("tests/cli/test_outputs.py", "test_a"),
        ("tests/cli/test_outputs.py", "test_b"),
        ("tests/x.py", ""),
    ]
    assert cited_tests("`::orphan`") == [("", "orphan")]


def test_the_documented_default_rounds_are_the_codes():
    from moepolicy.measure.rounds import DEFAULT_ROUNDS, MIN_ROUNDS

    said = re.findall(
        r"`--confirm-rounds`, default (\d+), at least (\d+)", (ROOT / "README.md").read_text()
    )
    assert said == [(str(DEFAULT_ROUNDS), str(MIN_ROUNDS))]


def test_the_readme_installs_torch_as_bench_says_to():
    """One word on torch in the README and in bench's hint: any build, the CPU build is enough, and
    PyTorch's CPU index gives it; the tests line pins the one these machines keep on disk."""
    from moepolicy.cli.bench import TORCH_CPU

    readme = (ROOT / "README.md").read_text()
    tests_line = next(line for line in bash_lines(readme) if "pytest" in line)
    assert "torch==2.13.0" in tests_line
    said = " ".join(readme.split())
    assert "Any torch works and the CPU build is enough" in said and f"`{TORCH_CPU}`" in said
