"""One rank of the two-rank CPU test: a real gloo group, vLLM's DeepEP HT manager (the plugin's),
one MoE layer built by vLLM's oracle, one forward through FusedMoEKernel.apply. The stand-in DeepEP
buffer exchanges what each rank hands it over gloo and fails if the ranks disagree on the Config or
the wire (the real kernels would hang or corrupt). Writes what this rank did as JSON.

usage: python vllm_two_ranks.py RANK INIT_FILE POLICY OUT_JSON LOCAL_TOKENS [VOTE_TIMEOUT_S]

POLICY "-": the plugin installed without MOEPOLICY_POLICY; "none": no plugin at all on this rank.
"""

import json
import sys
from pathlib import Path

import torch.distributed as dist
from _pytest.monkeypatch import MonkeyPatch

sys.path.insert(0, str(Path(__file__).parent))
import vllm_harness as h  # noqa: E402


def main(
    rank: int, init_file: str, policy: str, out: str, local_tokens: int, timeout_s=None
) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    group = dist.new_group([0, 1], backend="gloo")
    mp = MonkeyPatch()
    sys.modules["deep_ep"] = h.fake_deep_ep()
    h.Buffer.exchange_over = group
    h.cpu_runtime(mp)
    h.torch_fp8_ops(mp)
    h.cuda_platform(mp)
    if timeout_s is not None:
        from moepolicy.integrations.vllm import vote

        vote.VOTE_TIMEOUT_S = timeout_s
    if policy != "none":
        h.install_plugin(policy if policy != "-" else None)
    else:  # vLLM as it is, with DeepEP installed: all2all_utils imports its class when deep_ep imports
        from vllm.model_executor.layers.fused_moe import all2all_utils
        from vllm.model_executor.layers.fused_moe.prepare_finalize import deepep_ht

        mp.setattr(
            all2all_utils,
            "DeepEPHTPrepareAndFinalize",
            deepep_ht.DeepEPHTPrepareAndFinalize,
            raising=False,
        )
    h.vllm_config(mp, model="Qwen/Qwen3-30B-A3B-FP8")
    manager = h.make_manager(mp, group)
    kernel = h.make_kernel(
        manager, mp, "block", h.moe_config(2048, 2, moe_backend="flashinfer_cutlass")
    )
    h.forward_context(mp, {"model.layers.3.mlp.experts": kernel}, tokens_across_dp=[100, 3000])
    h.run_kernel(kernel, local_tokens, 2048, seed=rank)
    buffer = kernel.prepare_finalize.buffer
    run = getattr(manager, "_moepolicy", None)
    Path(out).write_text(
        json.dumps(
            {
                "plugin": run is not None,
                "applied": run is not None and run.applied,
                "reason": run.reason if run is not None else "",
                "num_sms": manager.num_sms,
                "digest": run.digest if run is not None else "",
                "dispatch": buffer.dispatched[-1]["config"].key(),
                "wire": buffer.dispatched[-1]["wire"],
                "combine": buffer.combined[-1]["config"].key(),
            }
        )
    )
    dist.barrier(group)
    dist.destroy_process_group()


if __name__ == "__main__":
    timeout = float(sys.argv[6]) if len(sys.argv) > 6 else None
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), timeout)
