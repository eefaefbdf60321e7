"""Auto-attach: with STITCHFLEET_ENABLED=1 every MonitoredSession of the job gets a StitchHook.

Input: the settings (the boot shim imports this module only when enabled; a direct import checks again).
Output: side effects only: The rules in full: docs/plugin/session.md.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import inspect
import logging
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from stitchfleet import settings
from stitchfleet.plugin.session import plain_session

log = logging.getLogger("stitchfleet.plugin")
TARGET = "tensorflow.python.training.monitored_session"
TARGETS = (TARGET, plain_session.TARGET)
SESSION_CLASSES = ("MonitoredSession", "SingularMonitoredSession")
PATCHED = "_stitchfleet_patched"


def _with_hook(hooks: Any) -> list[Any]:
    from stitchfleet.plugin.session.hook import StitchHook

    chosen = list(hooks or [])
    if not any(isinstance(h, StitchHook) for h in chosen):
        chosen.append(StitchHook())
    return chosen


def _wrap(init: Any) -> Any:
    @functools.wraps(init)
    def init_with_hook(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            # The hooks wherever the caller gave them: `SingularMonitoredSession([hook])` and
            # `MonitoredSession(creator, [hook])` pass them positionally (a `hooks` keyword added to
            # those was a TypeError, 'got multiple values for argument', and the job failed).
            bound = inspect.signature(init).bind(self, *args, **kwargs)
            bound.arguments["hooks"] = _with_hook(bound.arguments.get("hooks"))
            args, kwargs = bound.args[1:], bound.kwargs
        except Exception as err:  # never fail the session: run it as called, without the hook
            log.warning("stitchfleet: could not attach the hook: %s", err)
        init(self, *args, **kwargs)

    setattr(init_with_hook, PATCHED, True)
    return init_with_hook


def patch(module: ModuleType) -> None:
    """Wraps the session classes' constructors in `module` (idempotent); TF's client session module: its
    `Session.run` (`plain_session`)."""
    if module.__name__ == plain_session.TARGET:
        plain_session.patch(module)
        return
    for name in SESSION_CLASSES:
        cls = getattr(module, name, None)
        if cls is not None and not getattr(cls.__init__, PATCHED, False):
            cls.__init__ = _wrap(cls.__init__)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches TARGET right after it is executed, whoever imports it."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if fullname not in TARGETS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        run = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            try:
                patch(module)
            except Exception as err:
                log.warning("stitchfleet: could not patch %s: %s", fullname, err)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> bool:
    """Patches now if TF's session module is loaded, else on its import; False when disabled."""
    if not settings.current().enabled:
        return False
    for name in TARGETS:
        if name in sys.modules:
            patch(sys.modules[name])
    if not all(name in sys.modules for name in TARGETS) and not any(
        isinstance(f, _PatchOnImport) for f in sys.meta_path
    ):
        sys.meta_path.insert(0, _PatchOnImport())
    return True


try:
    install()
except Exception as error:  # importing this module must never break the interpreter
    print(f"stitchfleet: plugin boot failed, continuing without it: {error}", file=sys.stderr)
