"""``benchmarks/run_gpu_benchmarks.sh``, the GPU campaign's one command, checked on CPUs: it parses
(``bash -n``), and in its dry run every command it would run at EP 2 and EP 8, with a GPU per rank or
sharing one, names flags that exist: each ``moepolicy`` command line goes through moepolicy's own
parser and the checks a tune or bench makes of its values before any work (a campaign whose tunes
all exit 2 at once fails here), torchrun's through torchrun's parser, each script's flags appear in
its ``--help``, and the GPU suite collects."""

import os
import re
import shlex
import subprocess
import sys

import pytest

from conftest import ROOT

SCRIPT = ROOT / "benchmarks" / "run_gpu_benchmarks.sh"
CAMPAIGN = "links validate tune bench null torchrun overlap tests".split()
RESEARCH = (
    "dispatch sweep gemm placement overlap-green overlap-grouped overlap-dense overlap-mean "
    "overlap-no-wait overlap-unclustered"
).split()


def dry_run(tmp_path, ep: int, gpus: int, *steps: str) -> list[list[str]]:
    env = {**os.environ, "EP": str(ep), "GPUS": str(gpus), "OUT": str(tmp_path / "out")}
    done = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", *steps],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "out").exists()  # a dry run makes nothing
    return [shlex.split(line[2:]) for line in done.stdout.splitlines() if line.startswith("+ ")]


def test_the_script_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0


def check_moepolicy(argv: list[str]) -> None:
    """moepolicy's parser (an unknown flag or a bad choice exits 2), then the value checks a tune and
    a bench make before any work."""
    from moepolicy.cli.main import build_parser

    args = build_parser().parse_args(argv)
    if args.command == "tune":
        from moepolicy.cli.tune import tune_options
        from moepolicy.tuning.space import load_objective

        tune_options(args, load_objective())
    elif args.command == "bench":
        from moepolicy.cli.bench import _check_counts

        _check_counts(args)


def check_torchrun(argv: list[str]) -> list[str]:
    """torchrun's own flags, parsed by torchrun; the moepolicy command it starts."""
    from torch.distributed.run import get_args_parser

    parsed = get_args_parser().parse_args(argv)
    assert parsed.module and parsed.training_script == "moepolicy", argv
    return parsed.training_script_args


def check_script(argv: list[str]) -> None:
    """A benchmark script: it exists, and every flag given appears in its ``--help``."""
    script = ROOT / argv[0]
    assert script.is_file(), argv
    flags = [a for a in argv[1:] if a.startswith("--")]
    if flags:
        shown = subprocess.run(
            [sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=60
        ).stdout
        missing = [f for f in flags if not re.search(rf"{re.escape(f)}\b", shown)]
        assert not missing, (argv[0], missing)


def check(argv: list[str]) -> str:
    """Check one command line; returns what kind it was."""
    if argv[:2] == ["nvidia-smi", "topo"]:
        return "topology"
    assert argv[0] == "python3", argv
    rest = argv[1:]
    if rest[:2] == ["-m", "moepolicy"]:
        check_moepolicy(rest[2:])
        return rest[2]
    if rest[:2] == ["-m", "torch.distributed.run"]:
        pytest.importorskip("torch", reason="torchrun comes with torch")
        check_moepolicy(check_torchrun(rest[2:]))
        return "torchrun"
    if rest[:2] == ["-m", "pytest"]:
        return "pytest"
    check_script(rest)
    return rest[0]


@pytest.mark.parametrize("ep, gpus", [(2, 2), (8, 8), (8, 1)], ids=["ep2", "ep8", "ep8-shared"])
def test_every_command_of_the_campaign_names_flags_that_exist(tmp_path, ep, gpus):
    commands = dry_run(tmp_path, ep, gpus)
    kinds = [check(argv) for argv in commands]
    for path in ("topology", "validate", "tune", "bench", "torchrun", "pytest"):
        assert path in kinds, (path, kinds)
    tunes = [argv for argv in commands if argv[1:4] == ["-m", "moepolicy", "tune"]]
    assert any("--overlap" in argv for argv in tunes) and len(tunes) == 2
    assert kinds.count("bench") == 2  # the headline and the null check
    for argv in commands:  # every EP-sized command runs at the EP asked
        if "--ep-size" in argv:
            assert argv[argv.index("--ep-size") + 1] == str(ep)


def test_the_research_steps_name_flags_that_exist(tmp_path):
    for argv in dry_run(tmp_path, 2, 2, *RESEARCH):
        check(argv)


def test_the_gpu_suite_the_campaign_runs_collects(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-m",
            "gpu",
            "tests/gpu",
            "-q",
            "--co",
            "-p",
            "no:cacheprovider",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    collected = done.stdout
    for path in (
        "test_gpu_tune.py",
        "test_gpu_bench.py",
        "test_gpu_torchrun.py",
        "test_gpu_protocol.py",
    ):
        assert path in collected, path
