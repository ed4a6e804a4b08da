"""Typed access to the model fields of a config, wherever the checkpoint put them.

Multimodal checkpoints (Llama 4, Kimi-K2.5) keep the text model under ``text_config``; a field is
read there first, then at the top level. Errors name the file and the field.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Sequence, overload

from moepolicy.errors import CheckpointError

_MISSING = object()


class ConfigView:
    def __init__(self, config: dict[str, Any], path: str):
        self.path = path
        text = config.get("text_config")
        self._layers: list[dict[str, Any]] = [text] if isinstance(text, dict) else []
        self._layers.append(config)

    def raw(self, *keys: str) -> Any:
        """The first of ``keys`` present (and not null), text_config first; else ``None``."""
        for layer in self._layers:
            for key in keys:
                value = layer.get(key, _MISSING)
                if value is not _MISSING and value is not None:
                    return value
        return None

    def where(self, key: str) -> str:
        return (
            f"text_config.{key}"
            if self._layers[0].get(key) is not None and len(self._layers) > 1
            else key
        )

    @overload
    def integer(
        self, *keys: str, required: Literal[True], minimum: int = 0, maximum: int = 10_000_000
    ) -> int: ...

    @overload
    def integer(
        self, *keys: str, required: bool = False, minimum: int = 0, maximum: int = 10_000_000
    ) -> Optional[int]: ...

    def integer(
        self, *keys: str, required: bool = False, minimum: int = 0, maximum: int = 10_000_000
    ) -> Optional[int]:
        value = self.raw(*keys)
        if value is None:
            if required:
                raise CheckpointError(
                    f"{self.path}: missing field '{keys[0]}' (a plan needs it); "
                    f"looked for {', '.join(repr(k) for k in keys)}"
                )
            return None
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or not minimum <= value <= maximum
        ):
            raise CheckpointError(
                f"{self.path}: field '{self.first_present(keys)}' must be an integer from {minimum} "
                f"to {maximum}, got {str(value)[:40]!r}"
            )
        return value

    def int_list(self, *keys: str) -> Optional[list[int]]:
        value = self.raw(*keys)
        if value is None:
            return None
        if (
            not isinstance(value, list)
            or len(value) > 100_000
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        ):
            raise CheckpointError(
                f"{self.path}: field '{self.first_present(keys)}' must be a list of integers, "
                f"got {value!r:.80}"
            )
        return value

    def str_list(self, *keys: str) -> Optional[list[str]]:
        value = self.raw(*keys)
        if value is None:
            return None
        if (
            not isinstance(value, list)
            or len(value) > 100_000
            or not all(isinstance(v, str) for v in value)
        ):
            raise CheckpointError(
                f"{self.path}: field '{self.first_present(keys)}' must be a list of strings, "
                f"got {value!r:.80}"
            )
        return value

    def string(self, *keys: str) -> str:
        value = self.raw(*keys)
        if isinstance(value, list) and value and isinstance(value[0], str):
            return value[0]
        return value if isinstance(value, str) else ""

    def first_present(self, keys: Sequence[str]) -> str:
        for key in keys:
            if self.raw(key) is not None:
                return self.where(key)
        return keys[0]
