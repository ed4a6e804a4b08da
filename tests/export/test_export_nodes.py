"""The launches for EP across nodes carry the engine's multi-node flags: SGLang's the same command on
every node with that node's rank, vLLM's a head node and headless others; one node's launch has none."""

import shlex

from conftest import run_cli


def _plan(tmp_path, ep_size: int, *extra: str):
    policy = tmp_path / f"ds{ep_size}{''.join(extra)}.yaml"
    planned = run_cli(
        "plan",
        "--model",
        "DeepSeek-V3",
        "--ep-size",
        str(ep_size),
        "--gpu",
        "h200",
        *extra,
        "-o",
        str(policy),
    )
    assert planned.returncode == 0, planned.stderr
    return policy


def launch_line(tmp_path, ep_size: int, *extra: str) -> list[str]:
    policy = _plan(tmp_path, ep_size, *extra)
    done = run_cli("export", str(policy), "--to", "sglang", "--format", "launch")
    assert done.returncode == 0, done.stderr
    command = [line for line in done.stdout.splitlines() if line.startswith("python -m sglang")]
    return shlex.split(command[0]), done.stdout


def test_ep_16_on_8_gpu_nodes_runs_on_two_nodes(tmp_path):
    args, text = launch_line(tmp_path, 16)
    assert args[args.index("--nnodes") + 1] == "2"
    assert args[args.index("--node-rank") + 1] == "$NODE_RANK"  # the shell expands it on each node
    assert args[args.index("--dist-init-addr") + 1] == "$HEAD_ADDR:5000"
    assert "NODE_RANK=0..1" in text


def test_one_node_has_no_node_flags(tmp_path):
    args, _ = launch_line(tmp_path, 8)
    assert "--nnodes" not in args and "--node-rank" not in args


def vllm_launches(tmp_path, ep_size: int, *extra: str) -> list[list[str]]:
    policy = _plan(tmp_path, ep_size, *extra)
    done = run_cli("export", str(policy), "--to", "vllm")
    assert done.returncode == 0, done.stderr
    return [
        shlex.split(line, posix=False)
        for line in done.stdout.splitlines()
        if line.startswith("vllm serve")
    ]


def test_vllm_ep_16_on_8_gpu_nodes_has_a_head_and_headless_nodes(tmp_path):
    head, other = vllm_launches(tmp_path, 16)
    for args in (head, other):
        assert args[args.index("--data-parallel-size") + 1] == "16"
        assert args[args.index("--data-parallel-size-local") + 1] == "8"
        assert (
            args[args.index("--data-parallel-address") + 1] == "$HEAD_ADDR"
        )  # the shell expands it
    assert (
        "--headless" not in head and "--data-parallel-start-rank" not in head
    )  # ranks 0-7, the API server
    assert (
        "--headless" in other
        and other[other.index("--data-parallel-start-rank") + 1] == "$((NODE_RANK"
    )


def test_vllm_one_node_has_one_launch_without_node_flags(tmp_path):
    (args,) = vllm_launches(tmp_path, 8)
    assert "--data-parallel-size-local" not in args and "--headless" not in args


UNEVEN = ("--backend", "deepep_ll", "--gpus-per-node", "6")  # low latency: any EP size


def test_vllm_ep_not_a_multiple_of_the_node_gives_the_last_node_the_rest(tmp_path):
    """EP 16 on 6-GPU nodes: ranks 0-5, 6-11 and 12-15; every node told 6 ranks would start ranks
    12-17 of a 16-rank group."""
    launches = vllm_launches(tmp_path, 16, *UNEVEN)
    assert len(launches) == 3
    local = [int(args[args.index("--data-parallel-size-local") + 1]) for args in launches]
    assert local == [6, 6, 4] and sum(local) == 16
    assert all(args[args.index("--data-parallel-size") + 1] == "16" for args in launches)
    # two nodes, the second holding fewer: no middle launch
    head, last = vllm_launches(tmp_path, 8, *UNEVEN)
    assert [args[args.index("--data-parallel-size-local") + 1] for args in (head, last)] == [
        "6",
        "2",
    ]


def test_sglang_ep_not_a_multiple_of_the_node_runs_even_nodes(tmp_path):
    """SGLang gives every node tp/nnodes ranks: EP 16 on 6-GPU nodes runs on 4 nodes of 4 (3 nodes
    would be 5 ranks each, one rank left out), and the launch says so."""
    args, text = launch_line(tmp_path, 16, *UNEVEN)
    nodes = int(args[args.index("--nnodes") + 1])
    assert 16 % nodes == 0 and 16 // nodes <= 6 and nodes == 4
    assert "4 nodes of 4 GPUs" in text and "NODE_RANK=0..3" in text
