"""DeepEP's event objects (`EventHandle`, `EventOverlap`) for the distributed Buffer.

The rule: a Buffer op has finished, from the host's point of view, when it returns — counts are
read on the host before the payload moves, as in DeepEP's normal mode. What an event adds is
device-stream order: on an accelerator (cuda, npu, any `torch.Event` device) `EventHandle` is a
real event recorded on the current stream, and `current_stream_wait()` makes the current stream
wait for it; on the CPU there is no stream, the event is complete when created, and waiting is a
no-op. Either way DeepEP code that calls `event.current_stream_wait()` or uses
`with event: ...` runs unchanged.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch


class EventHandle:
    """A point in the current stream of `device` (DeepEP's `EventHandle`), or a completed marker on CPU."""

    def __init__(self, device: torch.device | str | None = None) -> None:
        self.device = torch.device("cpu") if device is None else torch.device(device)
        self._event: Any = None
        if self.device.type != "cpu":
            # torch.Event records on the current stream of its device type (cuda, npu, xpu, ...)
            self._event = torch.Event(device=self.device)
            self._event.record()

    @property
    def is_device_event(self) -> bool:
        """True when this handle carries a real device event (False: a CPU no-op marker)."""
        return self._event is not None

    def current_stream_wait(self) -> None:
        """Make the current stream of the event's device wait for it (nothing to wait for on CPU)."""
        if self._event is not None:
            self._event.wait()

    def query(self) -> bool:
        """Whether the work before the event has finished."""
        return True if self._event is None else bool(self._event.query())


class EventOverlap:
    """DeepEP's `EventOverlap`: wraps an EventHandle, keeps tensors alive until waited on, and
    works as a context manager (`with event: overlap_work()` waits on exit).

    event: the EventHandle (None only when built by hand); extra_tensors: tensors to keep alive.
    """

    def __init__(self, event: Optional[EventHandle] = None,
                 extra_tensors: Optional[Sequence[torch.Tensor]] = None) -> None:
        self.event = event
        self.extra_tensors = tuple(extra_tensors) if extra_tensors is not None else None
        self._release_handle_by_call = False
        self.hook_after_wait: Optional[Callable[[], None]] = None

    def current_stream_wait(self, release_handle: bool = False) -> None:
        """The current stream waits for the event; then the registered hook (if any) runs."""
        if self.event is not None:
            self.event.current_stream_wait()
        if self.hook_after_wait is not None:
            hook, self.hook_after_wait = self.hook_after_wait, None
            hook()
        if release_handle:
            self.event = None
            self.extra_tensors = None

    def register_hook_after_wait(self, hook_after_wait: Callable[[], None]) -> None:
        """Run `hook_after_wait` once, after the next `current_stream_wait()`."""
        if self.hook_after_wait is not None:
            raise RuntimeError("EventOverlap: a hook is already registered; wait on the event first")
        self.hook_after_wait = hook_after_wait

    def __call__(self, release_handle: bool = False) -> "EventOverlap":
        """`with event(release_handle=True): ...` drops the event after the wait on exit."""
        self._release_handle_by_call = release_handle
        return self

    def __enter__(self) -> "EventOverlap":
        return self

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> None:
        if self.event is not None:
            self.current_stream_wait(release_handle=self._release_handle_by_call)
        self._release_handle_by_call = False


def completed_event(device: torch.device, extra_tensors: Optional[Sequence[torch.Tensor]] = None) -> EventOverlap:
    """The event a Buffer op returns: recorded on `device`'s current stream after the op's work."""
    return EventOverlap(EventHandle(device), extra_tensors)
