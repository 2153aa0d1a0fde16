"""The one list of numerics names, per model family ("one list of numerics
names"; four copies before). The loader, the layer-range parts and each family's model read
them from here; what each name computes is the family's numerics strategy (Needle:
docs/numerics.md; transformer: `transformer/numerics.py`, docs/hf.md "Numerics").
"""

from __future__ import annotations

NEEDLE_NUMERICS = ("deploy", "float")  # Needle 3 / Needle 2 `.cact` archives
TRANSFORMER_NUMERICS = ("deploy", "float", "int8")  # Hugging Face / GGUF ("deploy" = "int8")
FAMILY_NUMERICS = {"needle3": NEEDLE_NUMERICS, "needle2": NEEDLE_NUMERICS,
                   "transformer": TRANSFORMER_NUMERICS}
ALL_NUMERICS = TRANSFORMER_NUMERICS  # every name some family accepts


def check_numerics(numerics: str, family: str) -> str:
    """`numerics` if the family accepts it, else a ValueError naming the accepted names."""
    allowed = FAMILY_NUMERICS[family]
    if numerics in allowed:
        return numerics
    if numerics in ALL_NUMERICS:
        raise ValueError(f"numerics must be one of {allowed}, got {numerics!r} (\"int8\" is "
                         f"for Hugging Face / GGUF transformer models)")
    raise ValueError(f"numerics must be one of {NEEDLE_NUMERICS} (or \"int8\" for Hugging "
                     f"Face / GGUF transformer models), got {numerics!r}")


def transformer_kind(numerics: str) -> str:
    """The transformer numerics a name means: "float", or "int8" ("deploy" and "int8")."""
    check_numerics(numerics, "transformer")
    return "float" if numerics == "float" else "int8"


__all__ = ["ALL_NUMERICS", "FAMILY_NUMERICS", "NEEDLE_NUMERICS", "TRANSFORMER_NUMERICS",
           "check_numerics", "transformer_kind"]
