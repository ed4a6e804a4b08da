"""SGLang's launch for EP across nodes carries its multi-node flags (the same command on every node,
with that node's rank); one node's launch has none."""

import shlex

from conftest import run_cli


def launch_line(tmp_path, ep_size: int) -> list[str]:
    policy = tmp_path / f"ds{ep_size}.yaml"
    assert run_cli("plan", "--model", "DeepSeek-V3", "--ep-size", str(ep_size), "--gpu", "h200",
                   "-o", str(policy)).returncode == 0
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
