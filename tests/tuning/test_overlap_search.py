"""The overlap search's logic (``moepolicy/tuning/overlap_search.py``) against a scripted bench: a config's
time is a known function of the split and the send chunks plus scripted noise. The bench is a test
double for the GPUs, not for the search under test."""

from collections import Counter
from types import SimpleNamespace

import pytest

pytest.importorskip("optuna", reason="the joint search uses optuna")

from moepolicy.tuning.bench import TrialFailed, Workload  # noqa: E402
from moepolicy.deepep.configs import ChunkConfig  # noqa: E402
from moepolicy.deepep.engines import VLLM_DBO_COMM_SMS  # noqa: E402
from moepolicy.tuning.overlap_search import OverlapSettings, search_overlap, with_send_chunks  # noqa: E402
from moepolicy.tuning.overlap_report import OverlapBucketRow, SplitTimes  # noqa: E402
from moepolicy.document.evidence import OverlapDoc, OverlapRowDoc  # noqa: E402
from moepolicy.document.model import unknown_fields  # noqa: E402

DEFAULT = (ChunkConfig(24, 256, 6, 128), ChunkConfig(10, 256, 6, 128))


def _rows(found) -> dict:
    """Each bucket's row as the policy document stores it (and ``audit`` reads it back); the row and
    the split's summary are what the document's typed evidence defines, written as given."""
    rows = {t: row.to_doc() for t, row in found.rows.items()}
    for t in found.rows:
        assert (
            OverlapBucketRow.from_doc(rows[t]).to_doc() == rows[t]
        )  # the stored form round-trips
        assert _as_typed(OverlapRowDoc, rows[t]) == list(rows[t].items())
    assert _as_typed(OverlapDoc, found.summary()) == list(found.summary().items())
    return rows


def _as_typed(kind, plain: dict) -> list:
    """``plain`` through the document's model ``kind``: no field it does not define, and the
    items it writes (in order, an int an int)."""
    typed = kind.model_validate(plain)
    assert unknown_fields(typed) == []
    return list(typed.model_dump(exclude_unset=True).items())


PLAN = SimpleNamespace(
    model=SimpleNamespace(moe_layers=[SimpleNamespace(moe_intermediate_size=2048)])
)
WORK = Workload(7168, 256, 8, 2, "fp8")


class ScriptedBench:
    """Overlapped time = |c - best_c| * 10 + chunk penalty + 500 (+ a lucky first reading for one split)."""

    def __init__(
        self,
        best_c=32,
        lucky_c=None,
        failing_c=None,
        flaky=None,
        comm_first_best_c=None,
        no_wait_best_c=None,
    ):
        self.best_c, self.lucky_c, self.failing_c, self.flaky = best_c, lucky_c, failing_c, flaky
        self.comm_first_best_c, self.no_wait_best_c = comm_first_best_c, no_wait_best_c
        self.calls, self.split_calls = Counter(), Counter()

    def measure_overlap(self, workload, point, gemm_shape):
        config = (point.num_sms, point.dispatch[0], point.combine[0], point.tokens)
        self.calls[config] += 1
        self.split_calls[(point.num_sms, point.tokens)] += 1
        if point.num_sms == self.failing_c or (config, self.calls[config]) == self.flaky:
            raise TrialFailed("scripted failure")
        t = (
            500
            + 10 * abs(point.num_sms - self.best_c)
            + 2 * abs(point.dispatch[0] - 24)
            + 3 * abs(point.combine[0] - 12)
        )
        if point.num_sms == self.lucky_c and self.split_calls[(point.num_sms, point.tokens)] == 1:
            t = 100.0  # one lucky reading: the confirmation rounds must not trust it
        part = {"median_us": t, "min_us": t * 0.99, "max_us": t * 1.01, "reps": 5}
        row = {
            "comm": dict(part, median_us=t * 0.8),
            "gemm": dict(part, median_us=t * 0.9),
            "serial": part,
            "overlapped": part,
            "overlapped_comm_end": part,
            "overlapped_gemm_end": part,
            "floor_us": t * 0.9,
            "comm_sms": point.num_sms,
            "gemm_sms": 132 - point.num_sms,
            "gemm_fp8": True,
            "gemm_kind": "scripted",
        }
        if self.comm_first_best_c is not None:  # the other launch order has its own best split
            u = 450 + 10 * abs(point.num_sms - self.comm_first_best_c)
            row["overlapped_comm_first"] = {"median_us": u, "min_us": u, "max_us": u, "reps": 5}
            row["deepep_waited_for_gemm"] = point.num_sms < self.best_c
        if self.no_wait_best_c is not None:  # comm first without the host wait: a third best split
            u = 400 + 10 * abs(point.num_sms - self.no_wait_best_c)
            row["overlapped_comm_first_no_wait"] = {
                "median_us": u,
                "min_us": u,
                "max_us": u,
                "reps": 5,
            }
            # the host wait makes the communication longer than the GEMM; without it, shorter
            row["comm"], row["comm_no_wait"] = (
                dict(part, median_us=t * 1.2),
                dict(part, median_us=t * 0.7),
            )
        return row


def _search(bench, grid=(12, 16, 24, 32, 48), trials=16, rounds=9, order="gemm-first"):
    return search_overlap(
        PLAN,
        bench,
        WORK,
        [(1024, 1.0), (4096, 1.0)],
        list(grid),
        DEFAULT,
        OverlapSettings(trials=trials, rounds=rounds, seed=0, order=order),
    )


def test_finds_the_best_split_and_chunks_jointly():
    bench = ScriptedBench(best_c=32)
    found = _search(bench, trials=40)
    assert found.comm_sms == 32
    assert set(found.splits_us) == {12, 16, 20, 24, 32, 48}  # vLLM's split is always scanned
    d, c = found.chunks
    assert d[0] == 24 and c[0] == 12  # the combine chunk moved off DeepEP's default 10
    row = _rows(found)[4096]
    assert row["rounds"] == 9 and len(row["vs_vllm_split_per_round"]) == 9
    assert row["vs_vllm_split"] < 1.0 and row["vllm_split_overlapped_us"] is not None
    assert row["rounds_from"] == "report" and row["speedup_vs_vllm_split"]["ci95"][0] > 1.0
    assert row["simultaneous_over"] == 2 and "verdict" not in row["speedup_vs_vllm_split"]
    assert found.gate.test.faster and found.report_vs_vllm.low > 1.0


def test_selection_gate_and_report_are_separate_rounds_and_nothing_else_is_measured_twice():
    bench = ScriptedBench(best_c=32)
    found = _search(bench, trials=30, rounds=9)
    assert (
        len(found.confirmed_us) == 4
    )  # the best config of the three best splits, and vLLM's split
    repeats = {k: n for k, n in bench.calls.items() if n > 1}
    kept = (found.comm_sms, found.chunks[0][0], found.chunks[1][0])
    vllm = (VLLM_DBO_COMM_SMS, 24, 10)
    for config, n in repeats.items():
        if config[:3] in (
            kept,
            vllm,
        ):  # the search, then (warm-up + rounds) in the selection, the gate and the report
            assert n == 1 + 3 * (1 + 9), (config, n)
        else:  # the other candidates: the search's measurement and the selection only
            assert n == 1 + (1 + 9), (config, n)
    assert len(repeats) == 4 * 2


def test_the_configs_take_turns_in_balanced_orders():
    from moepolicy.tuning.overlap_search import SplitConfig, _Measurer, measured_rounds

    order = []

    class Recording(ScriptedBench):
        def measure_overlap(self, workload, point, gemm_shape):
            if point.tokens == 1024:
                order.append(point.num_sms)
            return super().measure_overlap(workload, point, gemm_shape)

    m = _Measurer(PLAN, Recording(), WORK, [(1024, 1.0)], "scripted", "grid")
    configs = [SplitConfig(c, DEFAULT) for c in (12, 20, 32)]
    measured_rounds(m, configs, rounds=3)
    # each round starts with the config the last one ended with; none is always last
    assert order == [12, 20, 32, 32, 12, 20, 20, 12, 32]


def test_a_pick_that_is_not_faster_beyond_noise_than_vllms_split_is_not_kept():
    import math
    import random

    class Noisy(ScriptedBench):  # every split equal, 5 % noise: the pick is a selection's fluke
        rng = random.Random(1)

        def measure_overlap(self, workload, point, gemm_shape):
            row = super().measure_overlap(workload, point, gemm_shape)
            t = 500 * math.exp(self.rng.gauss(0, 0.05))
            row["overlapped"] = dict(row["overlapped"], median_us=t)
            return row

    found = _search(Noisy(best_c=VLLM_DBO_COMM_SMS), trials=8, rounds=9)
    assert found.comm_sms == VLLM_DBO_COMM_SMS and "vLLM's split kept" in found.why
    for row in _rows(found).values():  # the report records vLLM's split's own times
        assert row["rounds_from"] == "report" and row["vllm_split_overlapped_us"] is None


def test_one_lucky_reading_does_not_win():
    bench = ScriptedBench(best_c=32, lucky_c=12)
    found = _search(bench)
    assert found.comm_sms == 32  # 12 looked best once (100 us) but lost every confirmation round
    assert "c=12 chunks 24/10" in found.confirmed_us  # it was a candidate ...
    assert found.confirmed_us["c=12 chunks 24/10"] > min(
        found.confirmed_us.values()
    )  # ... and lost


def test_a_failing_split_is_skipped_and_the_search_goes_on():
    bench = ScriptedBench(best_c=32, failing_c=48)
    found = _search(bench)
    assert 48 not in found.splits_us and found.comm_sms == 32


def test_with_send_chunks_keeps_the_rest_of_the_config():
    assert with_send_chunks(DEFAULT, 32, 8) == (
        ChunkConfig(32, 256, 6, 128),
        ChunkConfig(8, 256, 6, 128),
    )


def test_a_failed_confirmation_round_is_dropped_for_every_candidate():
    # vLLM's config fails its 3rd measurement at 4096 tokens (1 in the scan, then selection rounds 1 and 2):
    # that selection round is dropped for every candidate; the gate and report rounds are complete
    bench = ScriptedBench(best_c=32, flaky=((VLLM_DBO_COMM_SMS, 24, 10, 4096), 3))
    found = _search(bench, rounds=9)
    for row in _rows(found).values():
        assert row["rounds"] == 9 and len(row["vs_vllm_split_per_round"]) == 9
        assert all(r < 1.0 for r in row["vs_vllm_split_per_round"])  # rounds stay paired


def test_the_launch_order_chooses_the_objective_and_both_are_reported():
    bench = ScriptedBench(best_c=32, comm_first_best_c=16)
    gemm_first = _search(bench, trials=24)
    comm_first = _search(
        ScriptedBench(best_c=32, comm_first_best_c=16), trials=24, order="comm-first"
    )
    assert gemm_first.comm_sms == 32 and comm_first.comm_sms == 16
    row = _rows(comm_first)[1024]
    assert (
        row["objective"] == "comm-first"
        and row["overlapped_us"] == row["comm_first_overlapped_us"] == 450
    )
    assert (
        row["vs_vllm_split"] == row["vs_vllm_split_comm_first"] == round(450 / 490, 3)
    )  # vLLM's 20: 4 SMs off
    d, c = comm_first.chunks
    assert row["gemm_first_overlapped_us"] == 500 + 10 * 16 + 2 * abs(d[0] - 24) + 3 * abs(
        c[0] - 12
    )  # still recorded
    assert (
        row["vllm_split_deepep_waited_for_gemm_rounds"] == row["rounds"]
    )  # 20 < 32: flagged every round
    mean = _search(ScriptedBench(best_c=32, comm_first_best_c=16), trials=24, order="mean")
    assert 16 <= mean.comm_sms <= 32 and mean.order == "mean"


def test_comm_first_without_the_host_wait_is_its_own_objective():
    bench = ScriptedBench(best_c=32, comm_first_best_c=16, no_wait_best_c=24)
    found = _search(bench, trials=24, order="comm-first-no-wait")
    assert found.comm_sms == 24 and found.order == "comm-first-no-wait"
    row = _rows(found)[1024]
    assert (
        row["objective"] == "comm-first-no-wait"
        and row["overlapped_us"] == row["comm_first_no_wait_overlapped_us"] == 400
    )
    assert (
        row["vs_vllm_split"] == row["vs_vllm_split_comm_first_no_wait"] == round(400 / 440, 3)
    )  # 20 is 4 SMs off
    assert row["comm_first_overlapped_us"] == 450 + 10 * 8  # the other orders are still recorded
    assert row["comm_no_wait_us"] and row["vllm_split_comm_no_wait_us"]
    # its floor and the grid's bound take the communication without the host wait (here below the GEMM)
    assert (
        row["comm_region"] == "no-wait"
        and row["comm_us"] == row["comm_no_wait_us"] < row["gemm_us"]
    )
    assert row["floor_us"] == row["gemm_us"] and row["best_floor_bound_by"] == "GEMM"
    gemm_first = _rows(
        _search(ScriptedBench(best_c=32, comm_first_best_c=16, no_wait_best_c=24), trials=24)
    )[1024]
    assert (
        gemm_first["comm_region"] == "full"
        and gemm_first["floor_us"] == gemm_first["comm_us"] > gemm_first["gemm_us"]
    )
    assert gemm_first["best_floor_bound_by"] == "communication"
    # mean stays the mean of gemm-first and comm-first (with the host wait)
    mean = _search(
        ScriptedBench(best_c=32, comm_first_best_c=16, no_wait_best_c=24), trials=24, order="mean"
    )
    assert 16 <= mean.comm_sms <= 32


@pytest.mark.parametrize(
    "order, missing",
    [
        ("comm-first", "comm-first"),
        ("comm-first-no-wait", "comm-first-no-wait"),
        ("mean", "comm-first"),
    ],
)
def test_an_order_the_bench_did_not_measure_fails_the_trial(order, missing):
    with pytest.raises(
        TrialFailed, match=f"launch order {order} needs the {missing} launch order measured"
    ):
        _search(ScriptedBench(best_c=32), trials=2, order=order)


def test_the_cli_offers_every_launch_order():
    import argparse

    from moepolicy.cli import tune
    from moepolicy.tuning.overlap_search import ORDERS

    sub = argparse.ArgumentParser().add_subparsers()
    tune.add_parser(sub)
    action = next(a for a in sub.choices["tune"]._actions if a.dest == "overlap_order")
    assert tuple(action.choices) == ORDERS


class PhysicalBench:
    """Communication alone falls as 1/c, the GEMM alone as 1/(132 - c) down to ``gemm_roof_us`` (a
    memory roof: more SMs stop helping); the pair overlaps to 3 % above the slower of the two. A
    split's floor is max(comm, GEMM), and the grid's lowest is known."""

    def __init__(self, gemm_roof_us: float = 0.0):
        self.gemm_roof_us = gemm_roof_us

    def measure_overlap(self, workload, point, gemm_shape):
        c = point.num_sms
        comm, gemm = 3000.0 / c, max(112000.0 / (132 - c), self.gemm_roof_us)
        row = {"comm_sms": c, "gemm_sms": 132 - c, "gemm_kind": "scripted"}
        for key, t in (
            ("comm", comm),
            ("gemm", gemm),
            ("serial", comm + gemm),
            ("overlapped", 1.03 * max(comm, gemm)),
            ("overlapped_comm_end", comm),
            ("overlapped_gemm_end", gemm),
        ):
            row[key] = {"median_us": t, "min_us": t, "max_us": t, "reps": 5}
        return row


def test_the_split_bound_is_the_lowest_floor_of_the_grid_set_beside_vllms_split():
    grid = (4, 8, 12, 16, 32)
    found = _search(PhysicalBench(), grid=grid, trials=4, rounds=9)
    floors = {c: max(3000.0 / c, 112000.0 / (132 - c)) for c in (*grid, VLLM_DBO_COMM_SMS)}
    best = min(floors, key=floors.get)
    assert best == 4  # GEMM-bound everywhere here: 875 us on 128 SMs; comm alone is 750 us
    for tokens in (1024, 4096):
        row = _rows(found)[tokens]
        assert row["best_floor_split"] == best and row["best_floor_bound_by"] == "GEMM"
        assert row["best_floor_us"] == round(floors[best], 1)
        vllm = 1.03 * floors[VLLM_DBO_COMM_SMS]
        assert row["best_floor_vs_vllm_split"] == round(floors[best] / vllm, 3)
        # the tuned split overlaps 3 % above its floor, so it sits above the bound, never below it
        assert row["vs_vllm_split"] >= row["best_floor_vs_vllm_split"]
        # vLLM's split is reported with its own parts, so the ratio can be read off
        assert row["vllm_split_gemm_us"] == round(112000.0 / 112, 1)
        assert row["vllm_split_comm_us"] == round(3000.0 / VLLM_DBO_COMM_SMS, 1)
        assert row["vllm_split_gemm"] == "scripted"


def test_the_gemms_speed_up_over_vllms_split_is_set_beside_the_sm_ratio():
    grid = (4, 8, 12, 16, 32)
    scaling = _search(PhysicalBench(), grid=grid, trials=4, rounds=9)
    c = scaling.comm_sms
    for row in _rows(scaling).values():
        assert (row["gemm_sms"], row["vllm_split_gemm_sms"]) == (132 - c, 112)
        assert row["gemm_sm_ratio_vs_vllm_split"] == round(112 / (132 - c), 3)
        # a GEMM whose time follows its SMs gains exactly the SM ratio
        assert row["gemm_alone_vs_vllm_split"] == row["gemm_sm_ratio_vs_vllm_split"]

    # a GEMM at a memory roof gains less than the SMs it was given (DeepSeek-V3's GEMM at 1024 tokens, measured 2026-11-30)
    def made(gemm_sms, vllm_gemm_sms, gemm_us, vllm_gemm_us):
        return OverlapBucketRow(
            "gemm-first",
            1,
            SplitTimes(1.0, (1.0, 1.0), 1.0, gemm_us, gemm_sms=gemm_sms),
            1.0,
            "full",
            vllm=SplitTimes(1.0, (1.0, 1.0), 1.0, vllm_gemm_us, gemm_sms=vllm_gemm_sms),
        )

    measured = made(126, 112, 1317.9, 1447.8).to_doc()
    assert (measured["gemm_alone_vs_vllm_split"], measured["gemm_sm_ratio_vs_vllm_split"]) == (
        0.91,
        0.889,
    )
    roof = 112000.0 / 120
    roofed = _search(PhysicalBench(gemm_roof_us=roof), grid=grid, trials=4, rounds=9)
    for row in _rows(roofed).values():
        expected = max(112000.0 / row["gemm_sms"], roof) / 1000.0
        assert (
            row["gemm_alone_vs_vllm_split"]
            == round(expected, 3)
            >= row["gemm_sm_ratio_vs_vllm_split"]
        )
    assert (
        "gemm_alone_vs_vllm_split" not in made(None, 112, 1.0, 1.0).to_doc()
    )  # SMs unknown: nothing claimed
