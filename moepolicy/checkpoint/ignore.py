"""Ignore-list matching, following the target engine's rule.

Engines differ, and the difference decides whether a layer's experts are quantized at all:

- vLLM, HF ``fp8`` ``modules_to_not_convert`` / ``ignored_layers``: exact module names
  (``quant_utils.is_layer_skipped``); GPTQ/AWQ ``modules_to_not_convert``: substring
  (``skip_with_substr=True``).
- SGLang: an entry matches at dot boundaries: equal to the module name, or a dotted prefix,
  suffix or middle part of it (sgl-project/sglang#23467, 2026-04-22).
- Both: ``re:`` entries (compressed-tensors) are regexes applied with ``re.match``; entries with
  ``*`` or ``?`` (ModelOpt ``exclude_modules``, mxfp4, Quark) are shell-style globs.
"""

from __future__ import annotations

import fnmatch
import re
from typing import Iterable, Optional

from moepolicy.schema.facts import IgnoreMatch

SUBSTRING_METHODS = {"gptq", "awq", "gptq_marlin", "awq_marlin", "marlin"}


def _regex_match(pattern: str, module: str) -> bool:
    try:
        return re.match(pattern, module) is not None
    except re.error:
        return False


def _dot_boundary(entry: str, module: str) -> bool:
    return (
        module == entry
        or module.startswith(entry + ".")
        or module.endswith("." + entry)
        or ("." + entry + ".") in module
    )


def entry_matches(entry: str, module: str, engine: str, method: str) -> Optional[str]:
    """The name of the matching rule if ``entry`` excludes ``module``, else ``None``."""
    if entry.startswith("re:"):
        return "regex (re.match)" if _regex_match(entry[3:], module) else None
    if any(ch in entry for ch in "*?["):
        return "glob (fnmatch)" if fnmatch.fnmatchcase(module, entry) else None
    if engine == "sglang":
        return "sglang dot-boundary" if _dot_boundary(entry, module) else None
    if method in SUBSTRING_METHODS:
        return "vllm substring" if entry in module else None
    return "vllm exact" if module == entry else None


def first_match(
    entries: Iterable[str], modules: Iterable[str], engine: str, method: str
) -> Optional[IgnoreMatch]:
    modules = list(modules)
    for entry in entries:
        for module in modules:
            mode = entry_matches(entry, module, engine, method)
            if mode:
                return IgnoreMatch(entry=entry, module=module, mode=mode)
    return None


def expert_modules(model_type: str, architecture: str, index: int) -> list[str]:
    """Names the engines test for layer ``index``'s routed experts (fused prefix, then linears)."""
    kind = (model_type or "").lower()
    if kind == "mixtral" or "Mixtral" in architecture:
        base = f"model.layers.{index}.block_sparse_moe.experts"
        return [base] + [f"{base}.0.{w}" for w in ("w1", "w2", "w3")]
    if kind.startswith("llama4"):
        base = f"language_model.model.layers.{index}.feed_forward.experts"
        return [base, f"{base}.gate_up_proj", f"{base}.down_proj"]
    if kind == "gpt_oss":
        base = f"model.layers.{index}.mlp.experts"
        return [base, f"{base}.gate_up_proj", f"{base}.down_proj"]
    base = f"model.layers.{index}.mlp.experts"
    return [base] + [f"{base}.0.{p}_proj" for p in ("gate", "up", "down")]
