"""DeepGEMM's runtime settings: the SM count it schedules for, its tensor-core utilisation cap, PDL,
the JIT heuristics' knobs, and the architecture its layout utilities target (here: the nvidia
backend's `arch` — forced by use_backend, else the CUDA device's).

The settings are recorded and read back exactly as DeepGEMM's runtime does (same ranges, same
defaults, 0 meaning "the device's value"); this library's kernels choose their own launches, so no
result depends on them. Without a CUDA device the SM count is the nominal one of the emulated
architecture (132 for SM90 as on an H800/H100 SXM, 148 for SM100 as on a B200), so upstream code such
as `set_num_sms(get_num_sms() - 20)` behaves as it would on that GPU.
"""

from __future__ import annotations

from ..core.checks import check_int
from ..core.errors import ContractError, format_problem
from ..core.device_sms import NOMINAL_SMS, device_num_sms, emulated_arch_major  # noqa: F401  (re-exported)

_settings: dict[str, int | bool | tuple[int, int] | None] = {
    "num_sms": 0, "tc_util": 0, "pdl": False, "ignore_compile_dims": False, "block_size_multiple_of": None}

#: 9 (SM90) or 10 (SM100): the architecture DeepGEMM's layout utilities and tests target
arch_major = emulated_arch_major


def set_num_sms(new_num_sms: int) -> None:
    """Limit the SMs DeepGEMM's kernels may use: 1..the device's count, or 0 for all of them (as
    DeepGEMM). Recorded and returned by get_num_sms."""
    check_int("set_num_sms", "new_num_sms", new_num_sms, 0, device_num_sms(),
              fix=f"pass 0 (all SMs) or a count between 1 and the device's {device_num_sms()}")
    _settings["num_sms"] = new_num_sms


def get_num_sms() -> int:
    """The SM count set by set_num_sms, else the device's (see device_num_sms)."""
    return int(_settings["num_sms"]) or device_num_sms()


def set_tc_util(new_tc_util: int) -> None:
    """The tensor-core utilisation cap in percent, 0..100 (0: no cap, read back as 100)."""
    check_int("set_tc_util", "new_tc_util", new_tc_util, 0, 100, fix="pass a percentage between 0 and 100")
    _settings["tc_util"] = new_tc_util


def get_tc_util() -> int:
    """The cap set by set_tc_util, 100 when none is set."""
    return int(_settings["tc_util"]) or 100


def set_pdl(new_enable_pdl: bool) -> None:
    """Enable programmatic dependent launch (recorded; read back by get_pdl)."""
    _settings["pdl"] = bool(new_enable_pdl)


def get_pdl() -> bool:
    """Whether set_pdl enabled programmatic dependent launch (default False)."""
    return bool(_settings["pdl"])


def set_ignore_compile_dims(new_value: bool) -> None:
    """DeepGEMM's JIT heuristic knob (compile one kernel for every shape); recorded only."""
    _settings["ignore_compile_dims"] = bool(new_value)


def set_block_size_multiple_of(new_value: int | tuple[int, int]) -> None:
    """DeepGEMM's JIT heuristic knob: block M and N multiples of one int or an (m, n) pair; recorded only."""
    pair = (new_value, new_value) if isinstance(new_value, int) else new_value
    if not isinstance(pair, (tuple, list)) or len(pair) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in pair):
        raise ContractError(format_problem(
            "set_block_size_multiple_of", "new_value", repr(new_value), "a positive int or a pair of them",
            "pass one block-size multiple for M and N, or (m_multiple, n_multiple)"))
    _settings["block_size_multiple_of"] = tuple(pair)
