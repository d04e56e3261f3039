"""Case-list upstream files: the file's own driver enumerates its cases, a sample of them is run.

FlashMLA's tests are not collections of argument-less `test_*` functions: a `main()` (or the
`__main__` block) builds a list of test parameters and calls one function per case. To run them
as upstream wrote them, the runner

1. imports the rewritten file and replaces that one function by a collector that records each
   call's arguments (and the default dtype in force, which `main()` sets) and returns a value that
   lets the loop go on (`stub`);
2. evaluates `entry` (e.g. `main()`) in the module, so the upstream code itself lists every case,
   in its order;
3. restores the function and calls it on a sample of the cases, one at a time, under the backend
   and an alarm; `passed` judges what it returns (an exception is a failure).

Nothing of a case is changed but what `prepare` names (FlashMLA: `num_runs = 0`, the count of
CUDA-kernel profiling repetitions after the correctness check) and a seed left at -1, which gets
the value upstream's counter would give it in a full run (its index in the list). Cases larger
than `max_cost` (elements a CPU reference touches) are not run and are counted as such.
"""

from __future__ import annotations

import copy
import random
from typing import Any, Callable, Sequence

import attrs


@attrs.frozen
class CaseDriver:
    """How one case-list file enumerates and runs its cases.

    function: the upstream function called once per case
    entry:    Python evaluated in the module's namespace that makes upstream's own code call
              `function` for every case (e.g. "main()")
    stub:     module -> the value the collector returns while enumerating
    passed:   the real return value -> passed?
    cost:     the case's arguments -> a size (elements the CPU reference touches)
    group:    the case's arguments -> a key; the sample takes cases from every group in turn
    label:    the case's arguments -> a short name for the report
    prepare:  the case's arguments -> the arguments actually passed (a copy)
    captured: module globals the upstream case reads besides its arguments (loop variables of a
              `__main__` block); their values at each call are restored before the case runs
    """

    function: str
    entry: str
    stub: Callable[[Any], Any]
    passed: Callable[[Any], bool]
    cost: Callable[[tuple], float]
    group: Callable[[tuple], Any] = lambda args: ()
    label: Callable[[tuple], str] = lambda args: ""
    prepare: Callable[[tuple], tuple] = lambda args: args
    captured: tuple[str, ...] = ()
    max_cost: float = 3e9


@attrs.frozen
class Case:
    index: int
    args: tuple
    kwargs: dict
    default_dtype: Any
    module_globals: dict = attrs.field(factory=dict)


def collect(module: Any, driver: CaseDriver) -> list[Case]:
    """Every case upstream's `entry` runs, in its order, without running one."""
    import torch

    cases: list[Case] = []
    real = getattr(module, driver.function)
    stub_value = driver.stub(module)

    def collector(*args, **kwargs):
        seen = {n: copy.deepcopy(vars(module)[n]) for n in driver.captured if n in vars(module)}
        cases.append(Case(len(cases), copy.deepcopy(args), copy.deepcopy(kwargs), torch.get_default_dtype(), seen))
        return stub_value

    setattr(module, driver.function, collector)
    try:
        exec(driver.entry, vars(module))
    finally:
        setattr(module, driver.function, real)
    return cases


def pick(cases: Sequence[Case], driver: CaseDriver, sample: int, seed: str) -> tuple[list[Case], int]:
    """(the cases to run, how many were over the size cap): with `sample` > 0, that many, taken
    from every group in turn (a seeded shuffle within each group); 0 runs all that fit."""
    fits = [c for c in cases if driver.cost(c.args) <= driver.max_cost]
    over = len(cases) - len(fits)
    if sample <= 0 or sample >= len(fits):
        return fits, over
    rng = random.Random(seed)
    groups: dict[Any, list[Case]] = {}
    for c in fits:
        groups.setdefault(driver.group(c.args), []).append(c)
    queues = [rng.sample(g, len(g)) for g in groups.values()]
    picked: list[Case] = []
    while len(picked) < sample:
        for q in queues:
            if q and len(picked) < sample:
                picked.append(q.pop())
    return sorted(picked, key=lambda c: c.index), over


def with_seed(args: tuple, index: int) -> tuple:
    """The first argument's `seed` of -1 set to `index`: what upstream's Counter gives the
    index-th case of a full run (it counts from 0, once per case)."""
    if args and getattr(args[0], "seed", None) == -1:
        first = copy.copy(args[0])
        first.seed = index
        return (first, *args[1:])
    return args
