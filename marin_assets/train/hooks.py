"""Training hooks: functions the step loop calls after a step, each on its own cadence.

    hooks = Hooks()
    hooks.add_hook(lambda info: print(info.step, info.metrics["loss"]), every=100)
    train(config, caches, out_dir, hooks=hooks)

The shape follows Levanter's trainer (stanford-crfm/levanter, ``src/levanter/trainer.py``:
``Trainer.add_hook(fn, every=N)``; its checkpointer is a hook called every step that keeps its
own cadence): ``every=N`` runs ``fn(info)`` after each global step divisible by N, so the steps
a hook runs at do not depend on where a phase, a resume or a warm start began. ``at_end=True``
runs it once more when the phase ends (its last step, a stop signal, or a resume that finds the
phase already complete), unless it has just run at that step. Nothing runs at the end of an
abandoned loop (``stop_at_step``) or after an error. With several processes every process runs
every hook at the same steps (the built-in ones make collective calls), so a hook that writes
files should write on process 0 only (``distributed.is_writer``).

``train`` registers its own hooks first, in this order: the metrics emitter, the
``stop_at_step`` kill, the stop-signal check (it marks the step final), the caller's stop check
(``stop_check``, e.g. the budget file's, at permanent checkpoint steps), the checkpoint
cadence, the held-out loss (at the end); a caller's hooks run after them, so they see whether
the step ends the phase. A driver that runs a phase through Dagster in its own process (the
demo's simulated user) adds hooks with ``hooks_in_this_context``: they run after the caller's.
A checkpoint is written in the background while training goes on; when a caller registers
hooks, ``train`` waits for a step's checkpoint to commit before they run, so a hook may read
it (without caller hooks the save overlaps the next steps).
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any

HookFn = Callable[["StepInfo"], Any]


@dataclasses.dataclass
class StepInfo:
    """What a hook sees after global step ``step``.

    ``state`` is the ``TrainState`` after it (valid during the call: the next step takes its
    buffers over); ``end_step`` is the phase's last step; ``stopped_by`` names the stop signal
    that ends the phase at this step (set by the stop-signal hook)."""

    step: int
    state: Any
    end_step: int
    row_fn: Callable[[], dict] | None = None  # this step's metrics row, from its device metrics
    stopped_by: str | None = None

    @property
    def final(self) -> bool:
        """This step ends the phase: its last step, or a stop signal's."""
        return self.step >= self.end_step or self.stopped_by is not None

    @functools.cached_property
    def row(self) -> dict | None:
        """The metrics row the emitter writes (computed once, shared with ``metrics``)."""
        return None if self.row_fn is None else self.row_fn()

    @property
    def metrics(self) -> dict | None:
        """A copy of this step's metrics row, as metrics.jsonl and ``log_fn`` get it (None at the
        end of a call that ran no step). Reading it waits for the step's device work, which the
        loop otherwise overlaps with the next step."""
        return copy.deepcopy(self.row)


@dataclasses.dataclass(frozen=True)
class Hook:
    """One registered hook: ``fn`` and when it runs."""

    fn: HookFn
    every: int | None  # None: only at the end
    at_end: bool

    def due(self, step: int) -> bool:
        """Whether it runs after global step ``step`` (during the steps)."""
        return self.every is not None and step % self.every == 0


class Hooks:
    """An ordered registry of hooks; ``train`` owns one and runs it after every step."""

    def __init__(self) -> None:
        self._hooks: list[Hook] = []

    def add_hook(self, fn: HookFn | None = None, *, every: int | None = 1, at_end: bool = False):
        """Run ``fn(info: StepInfo)`` after every global step divisible by ``every`` (None: never
        during the steps) and, with ``at_end``, once when the phase ends. Returns ``fn``; without
        it, a decorator: ``@hooks.add_hook(every=100)``."""
        _check_cadence(every, at_end)
        if fn is None:
            return functools.partial(self.add_hook, every=every, at_end=at_end)
        if not callable(fn):
            raise ValueError(f"a hook must be callable, got {fn!r}")
        self._hooks.append(Hook(fn, every, at_end))
        return fn

    def extend(self, other: Hooks | None) -> None:
        """Append ``other``'s hooks (a caller's, after the built-in ones)."""
        if other is not None:
            self._hooks.extend(other)

    def __iter__(self) -> Iterator[Hook]:
        return iter(list(self._hooks))

    def __len__(self) -> int:
        return len(self._hooks)

    def run(self, info: StepInfo) -> None:
        """The hooks due at ``info.step``, in registration order."""
        for hook in self:
            if hook.due(info.step):
                hook.fn(info)

    def run_end(self, info: StepInfo, stepped: bool) -> None:
        """The ``at_end`` hooks, at the phase's final ``info``; ``stepped``: ``run(info)`` has been
        called (a hook that was due there has already seen this step)."""
        for hook in self:
            if hook.at_end and not (stepped and hook.due(info.step)):
                hook.fn(info)


# Hooks every ``train`` call in this context adds (``hooks_in_this_context``).
_CONTEXT_HOOKS: contextvars.ContextVar[Hooks | None] = contextvars.ContextVar("marin_context_hooks", default=None)


@contextlib.contextmanager
def hooks_in_this_context(hooks: Hooks) -> Iterator[None]:
    """Add ``hooks`` to every ``train`` call made in this context (this thread, e.g. a phase run
    executed in process by Dagster), after the call's own: how a driver reaches the steps of a run
    it does not build the ``train`` call of. A run in another process (the Pipes backends) never
    sees them."""
    token = _CONTEXT_HOOKS.set(hooks)
    try:
        yield
    finally:
        _CONTEXT_HOOKS.reset(token)


def with_context_hooks(hooks: Hooks | None) -> Hooks | None:
    """``hooks`` followed by those of ``hooks_in_this_context`` (None when there are none)."""
    extra = _CONTEXT_HOOKS.get()
    if extra is None or not len(extra):
        return hooks
    merged = Hooks()
    merged.extend(hooks)
    merged.extend(extra)
    return merged


def _check_cadence(every: int | None, at_end: bool) -> None:
    if every is None:
        if not at_end:
            raise ValueError("a hook with every=None runs only at the end: pass at_end=True (or an every)")
        return
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"hook every must be a positive integer number of steps or None, got {every!r}")
