"""The package's functions stay small: at most 40 logical lines (the lines on which a statement
starts, which a formatter's wrapping of long calls does not change) and 8 parameters, outside the
measurement kernels (Triton kernels take every pointer, stride and block size as a parameter)."""

import ast
import re
from pathlib import Path

import moepolicy

PACKAGE = Path(moepolicy.__file__).parent
KERNEL_MODULES = {"measure/persistent_gemm.py", "measure/moe_glue.py", "quant/triton_kernels.py"}
MAX_LOGICAL_LINES, MAX_PARAMS = 40, 8


def _parameters(fn: ast.FunctionDef) -> int:
    a = fn.args
    count = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
    return count - (1 if a.args and a.args[0].arg in ("self", "cls") else 0)


def logical_lines(fn: ast.FunctionDef) -> int:
    """Lines on which a statement of ``fn``'s body starts (its docstring and nested defs' own lines
    count too: a nested function is part of the body it makes long)."""
    return len(
        {node.lineno for node in ast.walk(fn) if isinstance(node, ast.stmt) and node is not fn}
    )


def test_logical_lines_ignore_wrapping():
    wrapped = ast.parse(
        "def f(a):\n    x = g(\n        a,\n        a,\n    )\n    return x\n"
    ).body[0]
    assert logical_lines(wrapped) == 2


def test_no_function_is_over_40_logical_lines_or_8_parameters():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        if name in KERNEL_MODULES:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = logical_lines(node)
                if lines > MAX_LOGICAL_LINES or _parameters(node) > MAX_PARAMS:
                    found.append(
                        f"{name}:{node.lineno} {node.name}: {lines} logical lines, "
                        f"{_parameters(node)} parameters"
                    )
    assert not found, "\n".join(found)


def test_every_gpu_test_is_in_the_gpu_suite():
    """``pytest -m gpu tests/gpu`` is the GPU suite's one command: no test marked gpu lives elsewhere,
    where that command never collects it."""
    tests = Path(__file__).parent
    marked = re.compile(r"^(pytestmark = |@)pytest\.mark\.gpu\b", re.MULTILINE)
    outside = [
        path.relative_to(tests).as_posix()
        for path in sorted(tests.rglob("test_*.py"))
        if marked.search(path.read_text()) and path.parent.name != "gpu"
    ]
    assert not outside, outside
