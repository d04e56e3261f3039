"""Ascend chip generations and how they are detected (docs/ascend.md, *Chips*).

- "910b": Atlas A2 (Ascend 910B), soc versions 220-225, device names Ascend910B*
- "910c": Atlas A3 (Ascend 910_93), soc versions 250-255, device names Ascend910_93*
- "950":  Ascend 950PR/DT (arch35), soc version 260, device names Ascend950* / Ascend910_95*

The A2/A3 chips have no FP8 datatypes; the 950 adds FP8, HiFloat8, FP4 and MX (UE8M0) scales.
"""

from __future__ import annotations

from typing import Any, Literal

Chip = Literal["910b", "910c", "950"]
CHIPS: tuple[Chip, ...] = ("910b", "910c", "950")
#: the emulation default: the chip the MX formats were designed for
DEFAULT_CHIP: Chip = "950"

_SOC_RANGES: tuple[tuple[int, int, Chip], ...] = ((220, 225, "910b"), (250, 255, "910c"), (260, 260, "950"))


def chip_from_soc_version(version: int) -> Chip | None:
    """Chip of a `torch_npu.npu.get_soc_version()` value (None for chips this backend does not serve)."""
    for low, high, chip in _SOC_RANGES:
        if low <= version <= high:
            return chip
    return None


def chip_from_device_name(name: str) -> Chip | None:
    """Chip of a `torch_npu.npu.get_device_name()` string (torchair's arch35 test for the 950)."""
    if "Ascend950" in name or "Ascend910_95" in name:
        return "950"
    if name.startswith("Ascend910_93"):
        return "910c"
    if name.startswith("Ascend910B"):
        return "910b"
    return None


def detect_chip(npu: Any) -> Chip | None:
    """The chip behind a torch_npu module: its soc version first, then the device name."""
    try:
        chip = chip_from_soc_version(int(npu.npu.get_soc_version()))
    except Exception:  # an unusual build without the call: fall back to the name
        chip = None
    if chip is None:
        try:
            chip = chip_from_device_name(str(npu.npu.get_device_name()))
        except Exception:
            chip = None
    return chip


def check_chip(value: Any) -> Chip:
    """Validate a `soc=` backend option."""
    if value not in CHIPS:
        raise ValueError(f"soc must be one of {CHIPS} (910b = Atlas A2, 910c = Atlas A3, 950 = Ascend 950), "
                         f"got {value!r}")
    return value


def has_fp8(chip: Chip) -> bool:
    """FP8 / MX datatypes exist on the Ascend 950 only."""
    return chip == "950"
