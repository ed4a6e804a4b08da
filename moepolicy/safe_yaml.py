"""Safe YAML loading for every file moepolicy reads (policies, rule packs, data sheets): the safe
loader, a bound on the size aliases expand to (a 'billion laughs'), and parse errors as one phrase.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import yaml

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

MAX_EXPANDED_NODES = 2_000_000


def expanded_size(node: Any, limit: int = MAX_EXPANDED_NODES) -> int:
    """How many nodes ``node`` has once YAML aliases are expanded, counting shared objects once
    per reference (linear time over distinct objects); stops early past ``limit``."""
    memo: dict[int, int] = {}

    def size(n: Any, depth: int) -> int:
        if depth > 200:
            raise ValueError("nested deeper than 200 levels")
        if not isinstance(n, (dict, list)):
            return 1
        key = id(n)
        if key in memo:
            return memo[key]
        items = n.values() if isinstance(n, dict) else n
        total = 1
        for item in items:
            total += size(item, depth + 1)
            if total > limit:
                break
        memo[key] = total
        return total

    return size(node, 0)


def loads(text: str, then: Optional[Callable[[Any], Any]] = None) -> Any:
    """Safe-load ``text`` (JSON is YAML), ``then`` applied (a policy resolves its named facts), and
    refuse a tree past :data:`MAX_EXPANDED_NODES` nodes once expanded. Raises yaml.YAMLError on bad
    input and ValueError for a tree that explodes."""
    data = yaml.load(text, Loader=_Loader)  # noqa: S506 (safe loader)
    if then is not None:
        data = then(data)
    if expanded_size(data) > MAX_EXPANDED_NODES:
        raise ValueError(
            f"more than {MAX_EXPANDED_NODES} nodes once aliases and named facts are expanded"
        )
    return data


def yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML parse error as one phrase: ``invalid YAML at line 3 column 5: <problem>``."""
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"invalid YAML{where}: {problem}"
