"""The error hierarchy of portable_kernels.

Every error is a `PortableKernelsError` and also the closest builtin, so callers that catch
`ValueError`/`TypeError`/`RuntimeError` keep working. Messages name the op, the argument, what was
given, what was expected and how to fix it; `format_problem` builds them in one shape.
"""

from __future__ import annotations


class PortableKernelsError(Exception):
    """Base class of every error this library raises on purpose."""


class ContractError(PortableKernelsError, ValueError, TypeError):
    """An argument violates the op's contract (shape, dtype, device, value)."""


class LayoutError(PortableKernelsError, ValueError):
    """A tensor is in the wrong byte layout, or a conversion would change the math."""


class NoKernelError(PortableKernelsError, RuntimeError):
    """No provider of the selected backend accepts these inputs; lists every provider's reason."""

    def __init__(self, op: str, backend: str, reasons: dict[str, list[str] | str]):
        self.op = op
        self.backend = backend
        self.reasons = {name: [why] if isinstance(why, str) else list(why) for name, why in reasons.items()}
        lines = [f"{op}: no kernel of backend '{backend}' accepts these inputs."]
        if not reasons:
            lines.append("  the backend registers no provider for this op.")
        for provider, why in self.reasons.items():
            lines.append(f"  - {provider}: " + "; ".join(why))
        lines.append("Fix: change the inputs as a reason says, or pick another backend with "
                     "portable_kernels.use_backend(...).")
        super().__init__("\n".join(lines))


class BackendUnavailableError(PortableKernelsError, RuntimeError):
    """A backend was asked for but cannot run here (missing package, no device, broken plugin)."""


class EPTimeoutError(PortableKernelsError, TimeoutError, RuntimeError):
    """An expert-parallel collective did not complete: a peer rank died, left, or never arrived
    within the Buffer's timeout. The message names the process group and the op; the group is
    unusable afterwards (destroy it and create a new one)."""


def format_problem(op: str, arg: str, given: object, expected: object, fix: str) -> str:
    """One message shape for every contract and layout error."""
    return f"{op}: argument '{arg}' is {given}; expected {expected}. Fix: {fix}"
