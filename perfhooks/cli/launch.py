"""``perfhooks run SCRIPT [ARGS...]``: profile an unmodified training script.

The script runs as ``__main__`` (as ``python SCRIPT ARGS`` would run it) after a post-import hook is
set on each framework's construction path. From the command line, on POSIX, it runs in a fresh interpreter of the
same process (:func:`start_script_interpreter`), one frame deep. The hook does not import any framework itself; when the
script imports one, its integration adds perfhooks to every object built with it:

- a Lightning ``Trainer`` gets a ``PerfCallback`` unless it has one;
- a transformers ``Trainer`` gets a ``PerfTrainerCallback`` unless it has one, and
  ``report_to="perfhooks"`` is accepted;
- an ``Accelerator`` (not one that a transformers ``Trainer`` builds for itself) is attached, and
  what it prepares is watched.

Settings are the :class:`perfhooks.PerfConfig` fields, as options (``--output-dir``, ``--schedule
skip_first=8,warmup=2,active=3``, ``--no-wandb``) or environment variables (``PERFHOOKS_OUTPUT_DIR``,
``PERFHOOKS_SCHEDULE``, ``PERFHOOKS_WANDB=0``); an option wins over the environment. Every patch is
undone when the script ends. The exit status, stdout and stderr are the script's.
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import runpy
import sys
import types
from collections.abc import Callable
from dataclasses import fields
from importlib import metadata
from pathlib import Path
from typing import Any

from perfhooks.capture.schedule import Schedule
from perfhooks.config import DEFAULT_OVERHEAD_BUDGET, PerfConfig, overhead_budget, signal_names
from perfhooks.rules.thresholds import Thresholds
from perfhooks.runtime.ending import exit_guard

#: Settings that are not command-line material (objects built in code).
_NOT_OPTIONS = ("wandb_run", "thresholds", "schedule", "output_dir", "wandb")
ENV_PREFIX = "PERFHOOKS_"

#: The module whose import completes each framework's class -> (distribution, installer in
#: perfhooks.integrations; the versions it was tested on are in perfhooks.integrations.versions). The
#: packages themselves for Lightning and accelerate (their ``__init__`` finishes after the class's module, and
#: the integration imports from the package); transformers' lazy ``Trainer`` module for transformers.
FRAMEWORKS: dict[str, tuple[str, str]] = {
    "lightning.pytorch": ("lightning", "lightning"),
    "transformers.trainer": ("transformers", "transformers"),
    "accelerate": ("accelerate", "accelerate"),
}


# ----------------------------------------------------------------------------- settings
def parse_schedule(text: str, source: str = "--schedule") -> Schedule | None:
    """``skip_first=8,warmup=2,active=3`` -> ``Schedule(...)``; ``none`` -> no scheduled windows. ``source`` (the
    option or environment variable the text came from) is named in the error."""
    if text.strip().lower() in ("none", "off", ""):
        return None
    values: dict[str, int] = {}
    allowed = {f.name for f in fields(Schedule)}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or name not in allowed:
            raise ValueError(f"{source} takes name=value pairs of {', '.join(sorted(allowed))} "
                             f"(or 'none'), got {part.strip()!r}")
        try:
            values[name] = int(value)
        except ValueError:
            raise ValueError(f"{source} {name} must be an integer, got {value.strip()!r}") from None
    return Schedule(**values)


def _boolean(name: str, text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name} must be 1/0, true/false, yes/no or on/off, got {text!r}")


def _option_fields() -> list[Any]:
    return [f for f in fields(PerfConfig) if f.name not in _NOT_OPTIONS]


def add_setting_options(parser: argparse.ArgumentParser) -> None:
    """One option per :class:`PerfConfig` setting (``--max-traces 3``, ``--no-console``, ...)."""
    parser.add_argument("--output-dir", help="folder for report.json and traces/ (default: the integration's)")
    parser.add_argument("--schedule", help="capture windows, e.g. skip_first=8,warmup=2,active=3, or none")
    parser.add_argument("--wandb", dest="wandb", action="store_true", default=None,
                        help="log to W&B, opening a run if there is none")
    parser.add_argument("--no-wandb", dest="wandb", action="store_false", help="never log to W&B")
    parser.add_argument("--thresholds", help="diagnosis thresholds as JSON (fields of perfhooks.Thresholds)")
    described = setting_help()
    for item in _option_fields():
        flag = "--" + item.name.replace("_", "-")
        default = DEFAULT_OVERHEAD_BUDGET if item.name == "overhead_budget" else item.default
        text = f"{described.get(item.name, '')} (default {default}; {ENV_PREFIX}{item.name.upper()})"
        if item.type in ("bool", bool):
            text = text.replace("(default True;", f"(default True, off with --no-{flag[2:]};")
            parser.add_argument(flag, dest=item.name, action="store_true", default=None, help=text)
            parser.add_argument("--no-" + item.name.replace("_", "-"), dest=item.name, action="store_false",
                                help=argparse.SUPPRESS)
        else:
            parser.add_argument(flag, dest=item.name, default=None, metavar=item.name.upper(), help=text)


def settings_environment(args: argparse.Namespace) -> dict[str, str]:
    """The settings given as options, as the ``PERFHOOKS_<NAME>`` variables a launched process reads (``perfhooks
    tune`` passes them to its trials; ``output_dir`` is the caller's own)."""
    environment = {}
    for name in ("thresholds", *(f.name for f in _option_fields())):
        value = getattr(args, name, None)
        if value is not None:
            environment[ENV_PREFIX + name.upper()] = ("1" if value else "0") if isinstance(value, bool) else str(value)
    return environment


def setting_help() -> dict[str, str]:
    """Each :class:`PerfConfig` setting's description, from its docstring's ``Args:`` section (one line each)."""
    out: dict[str, str] = {}
    names: list[str] = []
    in_args = False
    for line in (PerfConfig.__doc__ or "").splitlines():
        stripped = line.strip()
        if stripped == "Args:":
            in_args = True
        elif in_args and stripped:
            head, colon, rest = stripped.partition(": ")
            if colon and not line.startswith(" " * 12):  # "name: text" or "a / b / c: text" opens an entry
                names = [name.strip() for name in head.split(" / ")]
                out.update(dict.fromkeys(names, rest))
            else:  # a continuation line
                out.update({name: f"{out[name]} {stripped}" for name in names})
    return {name: text.replace("``", "").replace("%", "%%") for name, text in out.items()}


def settings_from(args: argparse.Namespace, environ: dict[str, str] | os._Environ[str] = os.environ
                  ) -> dict[str, Any]:
    """PerfConfig keyword arguments from the options, else ``PERFHOOKS_<NAME>`` variables (validated)."""
    raw: dict[str, Any] = {}
    for name in ("output_dir", "schedule", "wandb", "thresholds", *(f.name for f in _option_fields())):
        value = getattr(args, name, None)
        source = "--" + name.replace("_", "-")
        if value is None and ENV_PREFIX + name.upper() in environ:
            value, source = environ[ENV_PREFIX + name.upper()], ENV_PREFIX + name.upper()
        if value is not None:
            raw[name] = (value, source)
    settings: dict[str, Any] = {}
    types_ = {f.name: f.type for f in fields(PerfConfig)}
    for name, (value, source) in raw.items():
        if name == "schedule":
            settings[name] = parse_schedule(value, source)
        elif name == "thresholds":

            try:
                settings[name] = Thresholds(**json.loads(value))
            except (ValueError, TypeError) as error:
                raise ValueError(f"{source} must be a JSON object of perfhooks.Thresholds fields: {error}") from None
        elif name == "signals":
            settings[name] = signal_names(value, source)
        elif name == "overhead_budget":
            settings[name] = overhead_budget(value, source)
        elif isinstance(value, bool) or name == "output_dir":
            settings[name] = value
        elif types_[name] in ("bool", "bool | None", bool):
            settings[name] = _boolean(source, value)
        elif types_[name] in ("int", "int | None", int):
            try:
                settings[name] = int(value)
            except ValueError:
                raise ValueError(f"{source} must be an integer, got {value!r}") from None
        else:
            try:
                settings[name] = float(value)
            except ValueError:
                raise ValueError(f"{source} must be a number, got {value!r}") from None
    PerfConfig.from_kwargs("perfhooks run", dict(settings))  # every value checked here, before the script runs
    return settings


# ----------------------------------------------------------------------------- post-import hooks
class _AfterExec(importlib.abc.Loader):
    """A loader that runs the module as its own loader would, then calls ``after(module)``."""

    def __init__(self, loader: Any, after: Callable[[types.ModuleType], None]) -> None:
        self._loader = loader
        self._after = after

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self._loader.exec_module(module)
        self._after(module)

    def __getattr__(self, name: str) -> Any:  # get_data, get_resource_reader, ... of the real loader
        return getattr(self._loader, name)


class PostImportHooks(importlib.abc.MetaPathFinder):
    """Call a function with a module right after it is first imported (or now, if it already is).

    A hook stays until its module runs: ``importlib.util.find_spec(name)`` (transformers asks whether
    accelerate is installed that way) finds a spec and imports nothing, so the import after it must still
    find the hook.
    """

    def __init__(self) -> None:
        self._hooks: dict[str, list[Callable[[types.ModuleType], None]]] = {}
        self._finding: set[str] = set()

    def add(self, name: str, hook: Callable[[types.ModuleType], None]) -> None:
        """``hook(module)`` once ``name`` is imported; several hooks on one module run in the order added."""
        if name in sys.modules:
            hook(sys.modules[name])
        else:
            self._hooks.setdefault(name, []).append(hook)

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name not in self._hooks or name in self._finding:
            return None
        self._finding.add(name)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._finding.discard(name)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _AfterExec(spec.loader, lambda module: self._ran(name, module))
        return spec

    def _ran(self, name: str, module: types.ModuleType) -> None:
        for hook in self._hooks.pop(name, []):
            hook(module)

    def install(self) -> None:
        sys.meta_path.insert(0, self)

    def remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)


# ----------------------------------------------------------------------------- the launcher
class Launcher:
    """Installs the construction hooks; :meth:`finish` closes what they attached and undoes every patch."""

    def __init__(self, settings: dict[str, Any], transformers_options: dict[str, Any] | None = None) -> None:
        self.settings = settings
        #: Arguments of PerfTrainerCallback that are not settings (``add_to_trainer_logs``).
        self.transformers_options = dict(transformers_options or {})
        self.hooks = PostImportHooks()
        self.undo: list[Callable[[], None]] = []
        #: Objects perfhooks was added to (trainers, accelerator sessions), for the final notice.
        self.attached: list[Any] = []
        self.closers: list[Callable[[BaseException | None], None]] = []
        self.finished = False
        #: Runs begun in this process before the script ran: any begun after are the script's own (a
        #: PerfTrainerCallback, PerfCallback or perfhooks.profile it already uses) or the launcher's.
        self.runs_before = exit_guard.runs_begun()

    def install(self) -> None:
        from perfhooks.integrations.versions import TESTED  # the integrations' table: imported when a run starts

        for module, (distribution, integration) in FRAMEWORKS.items():
            self.hooks.add(module, self._patcher(distribution, integration, TESTED[distribution]))
        self.hooks.install()

    def _patcher(self, distribution: str, integration: str, tested: tuple[tuple[int, int], tuple[int, int]]
                 ) -> Callable[[types.ModuleType], None]:
        def patch(module: types.ModuleType) -> None:
            try:
                _check_version(distribution, tested)
                installer = importlib.import_module(f"perfhooks.integrations.{integration}")
                self.undo.append(installer.instrument_constructions(module, self))
            except Exception as error:  # never into the user's script: it runs unprofiled by this framework
                print(f"perfhooks run: {distribution} is not profiled ({type(error).__name__}: {error})",
                      file=sys.stderr)

        return patch

    def finish(self, error: BaseException | None = None) -> None:
        """Close what is still open (accelerate sessions), undo the patches, remove the hooks."""
        self.finished = True
        self.hooks.remove()
        for close in self.closers:
            try:
                close(error)
            except Exception as fault:
                print(f"perfhooks run: closing failed ({type(fault).__name__}: {fault})", file=sys.stderr)
        for undo in reversed(self.undo):
            undo()
        self.undo.clear()
        profiled = exit_guard.runs_begun() > self.runs_before  # the script's own perfhooks counts too
        if not self.attached and not profiled and not isinstance(error, KeyboardInterrupt):
            print("perfhooks run: no Lightning Trainer, transformers Trainer or Accelerator was built; nothing was "
                  "profiled (a plain PyTorch loop adds `with perfhooks.profile(model, optimizer) as perf:`; "
                  "docs/plain-loop.md)", file=sys.stderr)


def _check_version(distribution: str, tested: tuple[tuple[int, int], tuple[int, int]]) -> None:
    try:
        version = metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return
    parts = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
    low, high = tested
    if len(parts) == 2 and not low <= parts <= high:
        print(f"perfhooks run: {distribution} {version} was not tested with the launcher "
              f"(tested {low[0]}.{low[1]} to {high[0]}.{high[1]}); profiling it anyway", file=sys.stderr)


#: Carries ``perfhooks run``'s own arguments (JSON) into the interpreter it starts for the script, which removes it
#: from its environment at once.
ARGV_VARIABLE = "PERFHOOKS_RUN_ARGV"
#: The program of that interpreter (``python -c``): the script runs in this program's frame, the only one under its
#: own (python SCRIPT has none).
BOOT = """\
from perfhooks.cli.main import launched_script
_launched = launched_script()
with _launched:
    if _launched.code is None:
        _launched.run_other()
    else:
        exec(_launched.code, _launched.namespace)
raise SystemExit(_launched.status)
"""


def start_script_interpreter(argv: list[str], script: list[str]) -> None:
    """Replace this process's interpreter (``os.execv``: the same pid, descriptors and environment) with ``python
    [its flags] -c BOOT``, which runs the script at the bottom of its stack: every frame under the script costs
    where the stack is formatted (autograd's anomaly mode formats it at each operation it records; nine frames of
    the launcher's cost an accelerate job 3 to 6% of its steps, ``benchmarks/results/short-jobs-2026-11-29.md``).
    ``argv``: ``perfhooks run``'s own arguments; ``script``: the script and its arguments (shown by ``ps``; the new
    interpreter reads ``argv``). Returns only where that cannot be done (not POSIX, no
    interpreter path, the exec failed); the caller then runs the script in this process."""
    import subprocess

    flags = getattr(subprocess, "_args_from_interpreter_flags", None)  # what multiprocessing gives its children
    if os.name != "posix" or not sys.executable or flags is None or getattr(sys, "frozen", False):
        return
    options = list(flags())
    if getattr(sys.stdout, "write_through", False) and "-u" not in options:  # python -u
        options.append("-u")
    os.environ[ARGV_VARIABLE] = json.dumps(argv)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    try:
        os.execv(sys.executable, [sys.executable, *options, "-c", BOOT, *script])
    except (OSError, ValueError):
        os.environ.pop(ARGV_VARIABLE, None)


def run(target: str, arguments: list[str], settings: dict[str, Any], module: bool = False,
        transformers_options: dict[str, Any] | None = None) -> int:
    """Run ``target`` (a script path, or a module with ``module=True``) as ``__main__`` in this process; its exit
    status."""
    if not module and not Path(target).is_file():
        print(f"perfhooks run: {target}: no such script", file=sys.stderr)
        return 2
    launched = LaunchedScript(target, arguments, settings, module=module, transformers_options=transformers_options)
    with launched:
        if launched.code is None:
            launched.run_other()
        else:  # executed in this frame: see _plain_script
            exec(launched.code, launched.namespace)
    return launched.status


class LaunchedScript:
    """``perfhooks run``'s script, to run in the caller's own frame::

        with launched:
            exec(launched.code, launched.namespace)  # or launched.run_other() where code is None
        status = launched.status

    Entering installs the construction hooks and gives the script python's ``sys.argv``, path and ``__main__``;
    leaving closes what perfhooks attached, undoes every patch and puts those back. The script's exceptions leave
    as python reports them: ``SystemExit`` and ``KeyboardInterrupt`` go on; another is printed by
    ``sys.excepthook`` from the script's first frame, and ``status`` is 1."""

    def __init__(self, target: str, arguments: list[str], settings: dict[str, Any], module: bool = False,
                 transformers_options: dict[str, Any] | None = None) -> None:
        self.target, self.arguments, self.settings, self.module = target, arguments, settings, module
        self.transformers_options = transformers_options
        self.status = 0
        self.script = None if module else _plain_script(os.path.abspath(target))
        #: The script's code (None: a module, a folder or zip, a .pyc: :meth:`run_other`) and its globals.
        self.code = None if self.script is None else self.script.code
        self.namespace: dict[str, Any] = {} if self.script is None else self.script.namespace
        self.launcher: Launcher | None = None
        self._saved_argv: list[str] = []
        self._script_dir: str | None = None

    def run_other(self) -> None:
        if self.module:
            runpy.run_module(self.target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(os.path.abspath(self.target), run_name="__main__")

    def __enter__(self) -> LaunchedScript:
        launcher = self.launcher = Launcher(self.settings, self.transformers_options)
        launcher.install()
        plan = os.environ.get("PERFHOOKS_TUNE_TRIAL")
        # a perfhooks.profile loop takes the launcher's settings under its own; a tune trial's folder over them
        settings = self.settings
        forced = {"output_dir": settings["output_dir"]} if plan and settings.get("output_dir") else {}
        from perfhooks.runtime.loops.plain_loop import launched_settings  # torch: only when a script is run

        launcher.undo.append(launched_settings(settings, forced))
        if plan:  # a perfhooks tune trial: its seams, its stop and its losses (perfhooks.integrations.trials)
            from perfhooks.integrations.trials import install as install_trial

            install_trial(launcher, plan)
        self._saved_argv = sys.argv[:]
        self._script_dir = None if self.module else str(Path(self.target).resolve().parent)
        sys.argv = [self.target, *self.arguments]
        if self._script_dir is not None:  # as python SCRIPT does: the script's folder first on the path
            sys.path.insert(0, self._script_dir)
        if self.script is not None:
            self.script.__enter__()
        return self

    def __exit__(self, _type: Any, error: BaseException | None, _traceback: Any) -> bool:
        launcher = self.launcher
        assert launcher is not None
        if self.script is not None:
            self.script.__exit__()
        try:
            if error is None or isinstance(error, SystemExit):  # the same code and message, through the interpreter
                return False
            if isinstance(error, KeyboardInterrupt):  # the interpreter's own handling: traceback, exit by SIGINT
                error.with_traceback(_script_frames(error.__traceback__, self.target))
                return False
            # as the interpreter reports an uncaught exception: excepthook, status 1
            launcher.finish(error)  # perfhooks' lines first: the script's traceback is what it prints last
            trimmed = _script_frames(error.__traceback__, self.target)
            sys.excepthook(type(error), error.with_traceback(trimmed), trimmed)
            self.status = 1
            return True
        finally:
            if not launcher.finished:
                clean = error is None or (isinstance(error, SystemExit) and error.code in (0, None))
                launcher.finish(None if clean else error)
            sys.argv = self._saved_argv
            if self._script_dir is not None and self._script_dir in sys.path:
                sys.path.remove(self._script_dir)


class _PlainScript:
    """A script's code and the fresh ``__main__`` module it runs in, with the globals ``python SCRIPT`` gives it; the
    module is ``sys.modules["__main__"]`` while it runs, and put back after (as ``runpy.run_path`` does)."""

    def __init__(self, path: str, code: types.CodeType) -> None:
        self.path, self.code = path, code
        self.module = types.ModuleType("__main__")
        # python SCRIPT's own (runpy's are __package__ "" and __loader__ None)
        loader = importlib.machinery.SourceFileLoader("__main__", path)
        self.module.__dict__.update(__file__=path, __cached__=None, __loader__=loader, __package__=None, __spec__=None)
        self.namespace = self.module.__dict__
        self._saved: list[Any] = []

    def __enter__(self) -> _PlainScript:
        self._saved.append(sys.modules.get("__main__"))
        sys.modules["__main__"] = self.module
        return self

    def __exit__(self, *_exc: object) -> None:
        if not self._saved:
            return
        main = self._saved.pop()
        if main is None:
            sys.modules.pop("__main__", None)
        else:
            sys.modules["__main__"] = main


def _plain_script(path: str) -> _PlainScript | None:
    """A plain source file, compiled, to execute in :func:`run`'s own frame; None for what runpy runs its own way (a
    folder or zip with ``__main__.py``, a ``.pyc``). runpy would add three frames of its own under the script's, and
    every frame costs where the stack is formatted: autograd's anomaly mode formats the whole stack at each
    operation it records (``benchmarks/results/short-jobs-2026-11-29.md``). A source that does not compile is left
    to runpy too, which raises its error as python does."""
    import io
    from pkgutil import get_importer

    if path.endswith((".pyc", ".pyo")) or get_importer(path) is not None:
        return None
    try:
        with io.open_code(path) as file:
            return _PlainScript(path, compile(file.read(), path, "exec"))
    except (OSError, SyntaxError, ValueError):
        return None


def _script_frames(tb: types.TracebackType | None, target: str) -> types.TracebackType | None:
    """The traceback from the script's first frame on (as ``python SCRIPT`` shows it): the frames of this
    launcher and of runpy above it are dropped; none is left for an error in compiling the script."""
    launcher = {os.path.abspath(__file__), os.path.abspath(runpy.__file__), "<frozen runpy>", "<string>"}
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if filename not in launcher and os.path.abspath(filename) not in launcher:
            break
        tb = tb.tb_next
    return tb
