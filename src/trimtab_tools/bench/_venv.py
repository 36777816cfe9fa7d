"""Virtual environments the benchmarks make for tools trimtab must not depend on.

A peer such as MXNet 1.9.1 needs ``numpy<1.24`` while trimtab needs ``numpy>=1.24``, and
a profiler such as py-spy is no dependency of trimtab's at all: each gets a venv of its
own under a cache folder (``~/.cache/trimtab`` unless ``TRIMTAB_CACHE_DIR`` says
otherwise; read at the CLI edge), made with ``python -m venv`` and ``pip install`` from
the package index pip is configured for, the first time it is asked for.

A venv this module made carries a marker file; a folder without the marker that lacks
the tool is never touched (it may be the user's own), only reported.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = ["ToolUnavailable", "default_cache_dir", "ensure_venv"]

#: Written into a venv right after this module created it.
MARKER = ".trimtab-venv"


class ToolUnavailable(RuntimeError):
    """A tool's venv could not be found or made; the message says why and what to do."""


def default_cache_dir() -> Path:
    """``$TRIMTAB_CACHE_DIR``, else ``~/.cache/trimtab``. Never blocks, never raises."""
    env = os.environ.get("TRIMTAB_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "trimtab"


def venv_python(venv: Path) -> Path:
    """The interpreter of ``venv`` (it may not exist yet)."""
    return venv / "bin" / "python"


@contextlib.contextmanager
def _locked(venv: Path) -> Iterator[None]:
    # Two benchmark runs asking for the same venv at once must not both install into it.
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def probe(python: Path, code: str, timeout_s: float = 120.0) -> str | None:
    """Run ``python -c code``; return its stripped stdout, or ``None`` if it failed.

    Blocks up to ``timeout_s``; never raises.
    """
    if not python.exists():
        return None
    try:
        done = subprocess.run(
            [str(python), "-c", code],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
            env=_clean_env(),
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _clean_env() -> dict[str, str]:
    # The tool's interpreter must not see trimtab's venv or path settings.
    drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")
    return {k: v for k, v in os.environ.items() if k not in drop}


def _run(argv: Sequence[str], what: str, timeout_s: float) -> None:
    try:
        done = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
            env=_clean_env(),
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise ToolUnavailable(f"{what} took over {timeout_s:.0f}s") from None
    except OSError as exc:
        raise ToolUnavailable(f"{what} could not start: {exc}") from None
    if done.returncode != 0:
        lines = [
            line
            for line in (done.stdout + done.stderr).splitlines()
            if line.strip() and not line.startswith("WARNING: Location")
        ]
        tail = "\n".join(lines[-8:])
        raise ToolUnavailable(f"{what} failed (status {done.returncode}):\n{tail}")


def ensure_venv(
    venv: Path,
    requirements: Sequence[str],
    check: str,
    *,
    install: bool = True,
    timeout_s: float = 900.0,
) -> tuple[Path, str]:
    """Return ``(interpreter, check output)`` of a venv in which ``check`` runs.

    ``check`` is Python code that exits 0 (and prints, say, a version) when the tool is
    usable. If it fails and ``install`` is true, the venv is made (``python -m venv`` with
    this interpreter's base Python) and ``pip install``-ed with ``requirements``, under a
    file lock so concurrent runs do not race. Blocks: a second or so when the venv is
    ready, up to ``timeout_s`` (a download) when it is not.

    Raises:
        ToolUnavailable: the venv lacks the tool and ``install`` is false; ``venv``
            exists, is not one this module made, and lacks the tool (it is left alone);
            or making or installing failed (no network, no wheel for this platform or
            Python version). The message names the venv and the cause.
    """
    python = venv_python(venv)
    wanted = " ".join(requirements)
    found = probe(python, check)
    if found is not None:
        return python, found
    if not install:
        raise ToolUnavailable(f"{venv} has no working {wanted} and installing was not allowed")
    with _locked(venv):
        found = probe(python, check)  # another run may have made it meanwhile
        if found is not None:
            return python, found
        if venv.exists() and any(venv.iterdir()) and not (venv / MARKER).exists():
            raise ToolUnavailable(
                f"{venv} exists, was not made by trimtab and has no working {wanted}: "
                "remove it or point trimtab at another folder"
            )
        if not python.exists():
            _run([sys.executable, "-m", "venv", str(venv)], f"python -m venv {venv}", 300.0)
            (venv / MARKER).write_text("made by trimtab_tools.bench for: " + wanted + "\n")
        _run(
            [str(python), "-m", "pip", "install", "--quiet", *requirements],
            f"pip install {wanted} into {venv}",
            timeout_s,
        )
        found = probe(python, check)
        if found is None:
            raise ToolUnavailable(f"{wanted} installed into {venv} but does not import")
        return python, found
