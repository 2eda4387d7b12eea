"""Loading a ``module:attribute`` reference: the one loader of every entry point.

``python -m worker`` (``WORKER_APP``), the ``streamq`` command (``--contracts``,
``STREAMQ_CONTRACTS``) and ``python -m streamq.compat snapshot`` all name an object of the
user's code this way, and all of them load it here, so they accept the same references and
say the same things when one is wrong.

Example::

    app = load_object("myapp.worker:app")          # the App
    contracts = load_object("myapp.contracts:CONTRACTS")
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from streamq.errors import LoadError

__all__ = ["load_object", "split_ref"]


def split_ref(ref: str) -> tuple[str, str]:
    """``(module, attribute)`` of ``package.module:attribute`` (the attribute may be dotted).

    Raises:
        LoadError: ``ref`` is not of that form (reason ``malformed``).
    """
    module_name, sep, attr = ref.strip().partition(":")
    if not sep or not module_name or not attr:
        raise LoadError(
            f"expected package.module:attribute, got {ref!r}", ref=ref, reason="malformed"
        )
    return module_name, attr


def load_object(ref: str, *, cwd_on_path: bool = True) -> Any:
    """Import the module of ``ref`` and return the attribute it names.

    Args:
        ref: ``package.module:attribute``; the attribute may be dotted (``mod:obj.app``).
        cwd_on_path: put the current directory first on ``sys.path`` when it is not there,
            as ``python -m`` does, so that the modules of the directory a command runs in
            can be named (a console script does not have it on the path by itself).

    Raises:
        LoadError: the reference is malformed, the module does not exist, the attribute is
            missing, or the user's module raised while it was imported (``reason`` says
            which; ``error`` holds the user's exception).
    """
    module_name, attr = split_ref(ref)
    if cwd_on_path and os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not _is_module_or_parent(exc.name, module_name):
            raise _raised(ref, exc) from exc  # the module exists; an import inside it failed
        raise LoadError(
            f"cannot import {module_name!r}: {exc}", ref=ref, reason="no_module"
        ) from exc
    except Exception as exc:
        # The user's module failed while it ran: a SyntaxError, a RegistrationError from a
        # decorator, a missing setting of their own... all of it is the user's to fix.
        raise _raised(ref, exc) from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise LoadError(
                f"module {module_name!r} has no attribute {attr!r}", ref=ref,
                reason="no_attribute",
            ) from None
        except Exception as exc:  # a module-level __getattr__ that raised
            raise _raised(ref, exc) from exc
    return obj


def _raised(ref: str, exc: BaseException) -> LoadError:
    what = " ".join(str(exc).split()) or "(no message)"
    return LoadError(
        f"cannot load {ref}: importing it raised {type(exc).__name__}: {what}",
        ref=ref, reason="raised", error=exc,
    )


def _is_module_or_parent(missing: str, module_name: str) -> bool:
    return module_name == missing or module_name.startswith(missing + ".")
