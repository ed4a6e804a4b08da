"""``moepolicy report --plots``: the figures are drawn from what the document records (rendered here,
headless, and checked as PNG files)."""

import copy

import pytest
import yaml

from conftest import run_cli
from moepolicy.document.yaml_io import parse_text

pytest.importorskip("matplotlib", reason="report --plots needs the [plots] extra")

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    folder = tmp_path_factory.mktemp("report")
    out = folder / "q.yaml"
    result = run_cli(
        "tune",
        "--model",
        "Qwen3-30B-A3B-FP8",
        "--ep-size",
        "2",
        "--storage",
        f"sqlite:///{folder}/s.db",
        "-o",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    return out


def _is_png(path):
    data = path.read_bytes()
    return data.startswith(PNG) and len(data) > 5000


def test_a_tuned_policy_draws_its_sm_scan_and_kept_vs_defaults(tuned, tmp_path):
    result = run_cli("report", str(tuned), str(tmp_path / "plots"))
    assert result.returncode == 0, result.stderr
    files = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert files == [
        "kept_vs_default.png",
        "sms.png",
    ]  # no orders or overlap in a modelled serial tune
    assert all(_is_png(tmp_path / "plots" / f) for f in files)


def test_every_figure_the_document_has_data_for(tuned, tmp_path):
    from moepolicy.document.model import PolicyDoc
    from moepolicy.export.plots import draw

    doc = copy.deepcopy(parse_text(tuned.read_text()))  # the layer facts' table resolved
    doc["deepep"]["measured_orders"] = [
        {"tokens": 1024, "quant_then_dispatch_us": 300.0, "dispatch_then_quant_us": 320.0},
        {"tokens": 4096, "quant_then_dispatch_us": 1100.0, "dispatch_then_quant_us": 900.0},
    ]
    doc["deepep"]["overlap"] = {
        "comm_sms": 32,
        "splits_us": {12: 900.0, 20: 850.0, 32: 800.0, 48: 870.0},
    }
    written = draw(PolicyDoc.model_validate(doc), tmp_path / "all")
    assert sorted(p.name for p in written) == [
        "kept_vs_default.png",
        "orders.png",
        "overlap.png",
        "sms.png",
    ]
    assert all(_is_png(p) for p in written)


def test_a_default_policy_has_nothing_to_draw_and_says_so(tmp_path):
    out = tmp_path / "ds.yaml"
    assert (
        run_cli("plan", "--model", "DeepSeek-V3", "--ep-size", "8", "-o", str(out)).returncode == 0
    )
    result = run_cli("report", str(out), str(tmp_path / "plots"))
    assert result.returncode == 1 and "nothing tuned to draw, a plan holds" in result.stderr
    assert "a live tune (--bench live" in result.stderr  # what would draw something
    assert not (tmp_path / "plots").exists()  # no empty folder left behind
    result = run_cli("report", str(out), "--plots", str(tmp_path / "missing" / "deeper"))
    assert (
        result.returncode != 0
        and "does not exist" in result.stderr
        and "Traceback" not in result.stderr
    )


def test_the_folder_defaults_to_the_policys_name_beside_it(tuned, tmp_path):
    import shutil

    policy = tmp_path / "mine.yaml"
    shutil.copy(tuned, policy)
    result = run_cli("report", str(policy))
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "mine-plots").iterdir()) == [
        "kept_vs_default.png",
        "sms.png",
    ]


def test_every_figure_says_which_model_target_and_tune_it_shows(tuned, tmp_path):
    """The caption names the model, GPU, EP size and what the numbers are; units are µs."""
    import matplotlib

    matplotlib.use("Agg")
    from moepolicy.document.model import PolicyDoc
    from moepolicy.export import plots

    doc = PolicyDoc.model_validate(parse_text(tuned.read_text()))
    for fn in (plots._sms, plots._kept):
        fig = fn(doc.deepep, "modelled")
        plots._caption(fig, plots._context(doc, "modelled"))
        texts = [fig._suptitle.get_text()] + [
            t.get_text() for ax in fig.axes for t in (ax.title, ax.yaxis.label)
        ]
        joined = " ".join(texts)
        assert (
            "Qwen/Qwen3-30B-A3B-FP8 on h200 EP2" in joined
            and "µs" in joined
            and " us" not in joined
        )


@pytest.mark.parametrize(
    "gate, words", [(None, "no fresh rounds"), ({"moved": True}, "fresh rounds, not on this scan")]
)
def test_the_overlap_legend_says_how_the_split_was_kept(gate, words):
    """A 2.1-era overlap policy kept what its scan chose; from 2.2 a gate in fresh rounds decides."""
    from moepolicy.document.evidence import OverlapDoc
    from moepolicy.document.model import DeepEPDoc
    from moepolicy.export.plots import _overlap

    overlap = {"comm_sms": 32, "splits_us": {20: 850.0, 32: 800.0}}
    if gate is not None:
        overlap["gate"] = gate
    deepep = DeepEPDoc.model_construct(num_sms=20, overlap=OverlapDoc.model_validate(overlap))
    fig = _overlap(deepep, "measured")
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert any("kept (32 SMs: " in t and words in t for t in labels), labels


def test_an_extrapolated_tune_says_why_nothing_is_drawn_and_what_would_draw(tmp_path):
    """The main job's own policy (a modelled tune outside the model bench's calibration keeps
    DeepEP's defaults): report says so and names the tunes that record figures."""
    out = tmp_path / "q.yaml"
    args = ("--model", "Qwen3-30B-A3B-FP8", "--ep-size", "8", "--bench", "model")
    storage = f"sqlite:///{tmp_path}/s.db"
    assert run_cli("tune", *args, "--storage", storage, "-o", str(out)).returncode == 0
    result = run_cli("report", str(out))
    line = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 1 and "'moepolicy tune' it first" not in line, line
    assert (
        "the tune kept DeepEP's defaults (extrapolated)" in line and "calibrated: h200 EP2" in line
    )
    assert "a live tune (--bench live" in line and "--bench model" in line


def test_a_partial_result_is_said_and_drawn_as_partial(tuned, tmp_path):
    """The picture of an interrupted tune says it is partial, on stderr and in every caption."""
    import matplotlib

    matplotlib.use("Agg")
    from moepolicy.document.keys import compute_keys
    from moepolicy.document.model import PolicyDoc
    from moepolicy.export import plots

    doc = yaml.safe_load(tuned.read_text())
    doc["deepep"]["partial"] = {"reason": "interrupted after 3 of 12 trials"}
    doc["key"] = compute_keys(doc)
    partial = tmp_path / "t.partial.yaml"
    partial.write_text(yaml.safe_dump(doc, sort_keys=False))
    result = run_cli("report", str(partial))
    assert result.returncode == 0, result.stderr
    assert "a partial result (interrupted after 3 of 12 trials)" in result.stderr
    context = plots._context(PolicyDoc.model_validate(parse_text(partial.read_text())), "modelled")
    assert context.startswith("PARTIAL (not for serving): ")
