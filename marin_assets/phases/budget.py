"""The run's budget file: the user-editable signal source of the phase controller.

YAML with ``budget_tokens`` (the compute/time budget in tokens), optional
``data_allotment_tokens`` ({source: tokens this run may draw, like a data quota}),
``hardware_available`` (tags with free capacity) and ``released_holds`` (phases a person has
looked at after the ladder watch held the run: the controller goes on past them). Editing it
is how a person raises or cuts the budget; the controller reads it on every tick.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import yaml

from marin_assets.config_files import load_structured


@dataclasses.dataclass(frozen=True)
class Budget:
    budget_tokens: int
    data_allotment_tokens: dict[str, int] = dataclasses.field(default_factory=dict)
    hardware_available: tuple[str, ...] = ()
    released_holds: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.budget_tokens, int) or self.budget_tokens < 0:
            raise ValueError(f"budget_tokens must be a non-negative integer, got {self.budget_tokens!r}")
        bad = {k: v for k, v in self.data_allotment_tokens.items() if not isinstance(v, int) or v < 0}
        if bad:
            raise ValueError(f"data_allotment_tokens must map sources to non-negative integers, got {bad}")
        if not all(isinstance(p, str) and p for p in self.released_holds):
            raise ValueError(f"released_holds must be a list of phase names, got {list(self.released_holds)!r}")

    def tokens_left(self, consumed: dict[str, int], available: dict[str, int]) -> dict[str, int]:
        """Per source: what the data (and its allotment, if any) still holds."""
        left = {}
        for source, remaining in available.items():
            cap = self.data_allotment_tokens.get(source)
            left[source] = remaining if cap is None else max(0, min(remaining, cap - consumed.get(source, 0)))
        return left


def load_budget(path: str | Path) -> Budget:
    path = Path(path)
    try:
        data = load_structured(path) or {}
    except FileNotFoundError:
        raise FileNotFoundError(f"budget file {path} does not exist (write budget_tokens: N into it)") from None
    if not isinstance(data, dict) or "budget_tokens" not in data:
        raise ValueError(f"budget file {path}: expected a mapping with budget_tokens, got {data!r}")
    unknown = set(data) - {"budget_tokens", "data_allotment_tokens", "hardware_available", "released_holds"}
    if unknown:
        raise ValueError(f"budget file {path}: unknown keys {sorted(unknown)}")
    released = data.get("released_holds") or ()
    if isinstance(released, str):
        raise ValueError(f"budget file {path}: released_holds must be a list of phase names, got the string {released!r}")
    try:
        return Budget(int(data["budget_tokens"]), dict(data.get("data_allotment_tokens") or {}),
                      tuple(data.get("hardware_available") or ()), tuple(released))
    except ValueError as err:
        raise ValueError(f"budget file {path}: {err}") from None


def write_budget(path: str | Path, budget: Budget) -> None:
    Path(path).write_text(yaml.safe_dump(dataclasses.asdict(budget) | {"hardware_available": list(budget.hardware_available),
                                                                       "released_holds": list(budget.released_holds)}))


def budget_fingerprint(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
