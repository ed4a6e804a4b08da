"""The timed DeepEP calls at EP 2 (ranks share the GPU where one is visible): the dispatch that does not wait on the host (``num_worst_tokens``)
delivers what the full dispatch delivers, so timing it times the same communication."""

import json

import pytest

from gpu_support import require

pytestmark = pytest.mark.gpu

WORLD, TOKENS, HIDDEN, EXPERTS, TOPK = 2, 1024, 7168, 256, 8


def _compare_regions(rank: int, world: int, rendezvous: str, out_dir: str) -> None:
    import deep_ep
    import torch
    import torch.distributed as dist

    from moepolicy.measure.deepep_ops import DeepEPOps, join_rank, make_workload

    device, buffer = join_rank(rank, world, rendezvous, 1 << 30)
    work = make_workload(TOKENS, HIDDEN, EXPERTS, TOPK, rank, device)
    ops = DeepEPOps(
        buffer, work, deep_ep.Config(20, 24, 256, 6, 128), deep_ep.Config(20, 10, 256, 6, 128)
    )
    (full_x, full_s), (nw_x, nw_s) = (
        ops.dispatch_only("fp8", "full"),
        ops.dispatch_only("fp8", "no-wait"),
    )
    rows = full_x.shape[0]
    try:
        ops.dispatch_only("fp8", "sideways")
        refused = ""
    except ValueError as exc:
        refused = str(exc)
    torch.cuda.synchronize(device)
    result = {
        "rows": rows,
        "expected_rows": ops.received_rows,
        "worst": nw_x.shape[0],
        "worst_tokens": ops.worst_tokens,
        "same_x": bool(torch.equal(full_x, nw_x[:rows])),
        "same_scales": bool(torch.equal(full_s, nw_s[:rows])),
        "refused": refused,
    }
    with open(f"{out_dir}/rank{rank}.json", "w") as f:
        json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


def test_no_wait_dispatch_delivers_what_the_full_dispatch_does(tmp_path):
    require(1, need_deep_ep=True)
    from moepolicy.measure.ranks import rendezvous_file, run_ranks

    run_ranks(
        _compare_regions, (WORLD, rendezvous_file("moepolicy-ops-"), str(tmp_path)), WORLD, 180.0
    )
    for r in range(WORLD):
        got = json.loads((tmp_path / f"rank{r}.json").read_text())
        # the worst case is every token of every rank; the full dispatch's rows are DeepEP's own counts
        assert got["worst"] == got["worst_tokens"] == TOKENS * WORLD
        assert 0 < got["rows"] == got["expected_rows"] < got["worst"]
        assert got["same_x"] and got["same_scales"], got
        assert "timed region must be one of" in got["refused"]
