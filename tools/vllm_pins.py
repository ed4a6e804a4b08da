"""The plugin's source pins (moepolicy/integrations/vllm/pins.py) for a vLLM tree, without importing it.

To check a new vLLM release before the plugin is said to support it::

    pip download --no-deps vllm==X.Y.Z && unzip -q vllm-X.Y.Z-*.whl 'vllm/*' -d vllm-X.Y.Z
    python tools/vllm_pins.py vllm-X.Y.Z            # the hash of every pinned function there
    python tools/vllm_pins.py vllm-X.Y.Z --diff OLD  # and, for each that changed, its diff

Each function's text is what ``inspect.getsource`` returns for it (decorators included), found with
``ast``; signature pins (``name()``) are listed, to compare by hand. A release joins ``pins.PINNED``
only after every changed function has been read and found not to touch what the plugin relies on.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import hashlib
import sys
from pathlib import Path
from typing import Optional


def source_of(root: Path, module: str, attribute: str) -> Optional[str]:
    """The source text of ``module``'s ``attribute`` (dotted: ``Class.method``) under ``root``."""
    path = root / (module.replace(".", "/") + ".py")
    if not path.is_file():
        return None
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    node: ast.AST = ast.parse(text)
    for part in attribute.removesuffix("()").split("."):
        found = [
            n
            for n in getattr(node, "body", [])
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and n.name == part
        ]
        if not found:
            return None
        node = found[-1]  # the last definition wins, as at import
    first = min([d.lineno for d in node.decorator_list] + [node.lineno])
    return "".join(lines[first - 1 : node.end_lineno])


def pin_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def main(argv: Optional[list[str]] = None) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from moepolicy.integrations.vllm import pins

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tree", type=Path, help="a folder holding vllm/ (an unpacked wheel)")
    parser.add_argument("--diff", type=Path, help="another release's tree: diff what changed")
    parser.add_argument(
        "--release", default=pins.CHECKED_RELEASES[-1], help="the pinned table to compare with"
    )
    args = parser.parse_args(argv)
    changed = 0
    for table in (pins.PINNED[args.release], pins.PINNED_V2[args.release]):
        for (module, attribute), expected in table.items():
            text = source_of(args.tree, module, attribute)
            name = f"{module.rsplit('.', 1)[-1]}.{attribute}"
            if text is None:
                print(f"missing  {name}")
                changed += 1
                continue
            if attribute.endswith("()"):
                print(f"by hand  {name} (a signature pin: compare its parameters)")
                continue
            found = pin_hash(text)
            same = found == expected
            changed += not same
            print(f"{'same    ' if same else 'changed '} {name} {found}")
            if not same and args.diff:
                old = source_of(args.diff, module, attribute) or ""
                sys.stdout.writelines(
                    difflib.unified_diff(
                        old.splitlines(True), text.splitlines(True), str(args.diff), str(args.tree)
                    )
                )
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
