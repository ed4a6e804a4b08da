"""The package's functions stay small: at most 60 lines and 8 parameters, outside the measurement
kernels (Triton kernels take every pointer, stride and block size as a parameter)."""

import ast
from pathlib import Path

import moepolicy

PACKAGE = Path(moepolicy.__file__).parent
KERNEL_MODULES = {"measure/persistent_gemm.py", "quant/triton_kernels.py"}
MAX_LINES, MAX_PARAMS = 60, 8


def _parameters(fn: ast.FunctionDef) -> int:
    a = fn.args
    count = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
    return count - (1 if a.args and a.args[0].arg in ("self", "cls") else 0)


def test_no_function_is_over_60_lines_or_8_parameters():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        if name in KERNEL_MODULES:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_LINES or _parameters(node) > MAX_PARAMS:
                    found.append(f"{name}:{node.lineno} {node.name}: {lines} lines, {_parameters(node)} parameters")
    assert not found, "\n".join(found)
