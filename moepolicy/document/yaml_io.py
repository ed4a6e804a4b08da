"""Read and write policy documents (YAML or JSON, the same tree); writes are atomic.

The YAML is written for people: no anchors or aliases, and each distinct set of layer facts once,
in a ``layer_facts`` table before ``layers`` that each layer names (``facts: moe-1``; schema 2.3 on,
an earlier document keeps its facts in each layer). Reading resolves the names back, so the
document tree (what is validated and what the keys cover) is the one JSON writes in full; YAML
written before (facts per layer, anchors) reads as it always did.

A writer never leaves a partial file: it writes a temporary file beside the target, flushes and
fsyncs it, then renames it over the target (:func:`moepolicy.files.atomic_write`).
"""

from __future__ import annotations

import json
import os
from typing import Any

import yaml

from moepolicy.document.facts_table import FACTS_TABLE, resolved_facts, with_facts_table  # noqa: F401
from moepolicy import safe_yaml
from moepolicy.files import atomic_write  # noqa: F401 (the writers' one home; imported from here by callers)

_Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class _Flow(dict):
    """A mapping written on one line (wire, facts, chunk configs)."""


class _FlowList(list):
    """A list written on one line."""


def _flow_dict(dumper: yaml.SafeDumper, data: dict) -> yaml.Node:
    return dumper.represent_mapping("tag:yaml.org,2002:map", data.items(), flow_style=True)


def _flow_list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=True)


# a base chosen at run time (libyaml's dumper where PyYAML was built with it): no static type
class _PolicyDumper(_Dumper):  # type: ignore[misc, valid-type]
    """Safe dumper with one-line mappings for wire, facts and chunk configs, and no anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


_PolicyDumper.add_representer(_Flow, _flow_dict)
_PolicyDumper.add_representer(_FlowList, _flow_list)

_FLOW_KEYS = {"wire", "facts", "dispatch", "combine", "scale", "deep_ep", "options"}


def _styled(node: Any, key: str = "", memo: dict[int, Any] | None = None) -> Any:
    """Copy ``node`` with flow styles; an object met twice stays one object (one YAML anchor)."""
    memo = {} if memo is None else memo
    if id(node) in memo:
        return memo[id(node)]
    if isinstance(node, dict):
        inner = {k: _styled(v, k, memo) for k, v in node.items()}
        out: Any = _Flow(inner) if key in _FLOW_KEYS else inner
    elif isinstance(node, list):
        items = [_styled(v, "", memo) for v in node]
        out = _FlowList(items) if all(not isinstance(v, (dict, list)) for v in node) else items
    else:
        return node
    memo[id(node)] = out
    return out


def dumps(doc: dict[str, Any], fmt: str = "yaml") -> str:
    """The document as JSON (the whole tree) or as YAML for people (see the module's note)."""
    if fmt == "json":
        return json.dumps(doc, indent=2) + "\n"
    return yaml.dump(
        _styled(with_facts_table(doc)),
        Dumper=_PolicyDumper,
        sort_keys=False,
        width=10_000,
        allow_unicode=True,
    )


def write_document(doc: dict[str, Any], path: str | os.PathLike, fmt: str | None = None) -> None:
    fmt = fmt or ("json" if str(path).endswith(".json") else "yaml")
    atomic_write(path, dumps(doc, fmt))


def parse_text(text: str) -> Any:
    """Safe-load a policy (YAML; JSON is YAML), its named layer facts resolved. Raises
    yaml.YAMLError on bad input, ValueError for a document that explodes when its aliases and named
    facts are expanded (a 'billion laughs') and PolicyError for named facts that do not resolve
    (one line, no file)."""
    return safe_yaml.loads(text, then=resolved_facts)
