"""User code: an entry named by path, its source digested, and imported only from a checked copy.

A user arm's builder and a user environment's factory are both *entries*: ``"arms.py:build_mlp"``
or ``"package.module:make"``. Owns: parsing an entry (``parse_entry``), finding the source it names
(``locate_source``: one module file, a local package directory, or an installed package), reading
and digesting that source (``read_source``, ``source_files``, ``source_digest``), making a copy of
it importable in this process under the digests it must have (``provide``, ``FrozenSource``) and
resolving an entry from what was provided (``resolve_entry``). A copy is re-hashed right before
its first import and imported under a name of its own (never the user's module name), without
writing bytecode into it, so a frozen copy stays exactly the bytes its freeze bound.

Does not own: what an entry must return (the arm's contract: ``qhlab.study.family``; the
environment's: ``qhlab.scenes.environment``), where a copy is kept (a study's ``family/``, a
population's ``environment/``) or digests of evidence files (``qhlab.evidence``).
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.resources.abc
import importlib.util
import io
import linecache
import os
import re
import sys
import sysconfig
import traceback
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from qhlab.evidence import EvidenceError, QhError, QhInputError, canonical_json, differing_keys, sha256_bytes

__all__ = [
    "ENTRY_FORMS",
    "UNFROZEN_HINT",
    "EntrySpec",
    "FrozenSource",
    "LocatedSource",
    "UnfrozenImportError",
    "file_digests",
    "is_installed",
    "locate_source",
    "missing_sibling",
    "parse_entry",
    "provide",
    "read_source",
    "resolve_entry",
    "source_digest",
    "source_files",
    "unbound_modules",
    "user_frames",
    "user_location",
]

# A source is code, not data: a package this large is a mistake (a virtualenv, a dataset).
_MAX_FILES = 2000
_MAX_BYTES = 32 * 2**20
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
ENTRY_FORMS = '"file.py:function" (relative to the file that names it) or "package.module:function"'
UNFROZEN_HINT = (
    "only the named file (or, for a file inside a package, the whole package) is frozen: make its "
    "directory a package (add __init__.py) and import the module relatively (from .helpers import x), "
    "or move the code into the one file"
)


@dataclass(frozen=True)
class EntrySpec:
    """A parsed entry string (a builder or a factory).

    Attributes:
        text: the string as written.
        module: ``"path/to/file.py"`` (``is_file``) or ``"package.module"``.
        function: the entry function's name.
        is_file: the module is named by a file path.
    """

    text: str
    module: str
    function: str
    is_file: bool


def parse_entry(text: Any, *, field: str = "builder") -> EntrySpec:
    """Parse ``"file.py:function"`` or ``"package.module:function"``.

    Args:
        text: the entry as written.
        field: what the config calls it (``builder``, ``environment.factory``), for messages.

    Raises:
        ValueError: any other form (the message says what is allowed).
    """
    if not isinstance(text, str) or "\x00" in text or text.count(":") != 1:
        raise ValueError(f"{field}={text!r} is not allowed; allowed: {ENTRY_FORMS}")
    module, function = text.split(":")
    is_file = module.endswith(".py")
    if not _IDENTIFIER.match(function) or not module or (not is_file and not _DOTTED.match(module)):
        raise ValueError(f"{field}={text!r} is not allowed; allowed: {ENTRY_FORMS}")
    if is_file and not _IDENTIFIER.match(Path(module).stem):
        raise ValueError(
            f"{field}={text!r} is not allowed; allowed: a file whose name is a Python identifier "
            f"plus .py, in {ENTRY_FORMS}"
        )
    return EntrySpec(text=text, module=module, function=function, is_file=is_file)


@dataclass(frozen=True)
class LocatedSource:
    """Where an entry's source is, and what of it is copied.

    Attributes:
        kind: ``"file"`` (one module file), ``"package"`` (a local package directory) or
            ``"installed"`` (an installed package's directory).
        path: the file or the package directory (what is copied).
        module: the dotted module inside the copy (``"arms"``, ``"mypkg.models"``).
        function: the entry's name.
    """

    kind: Literal["file", "package", "installed"]
    path: Path
    module: str
    function: str


def _package_top(file: Path) -> Path | None:
    """The outermost package directory holding ``file`` (None: its directory is no package)."""
    top = None
    directory = file.parent
    while (directory / "__init__.py").is_file():
        top = directory
        if directory.parent == directory:
            break
        directory = directory.parent
    return top


def locate_source(spec: EntrySpec, base: Path) -> LocatedSource:
    """Find the source an entry names, relative to ``base`` (the directory of the file naming it).

    A ``.py`` path is one module file, unless its directory is a package: then the outermost
    package directory is the source, so that its relative imports resolve in the copy. A
    dotted name is a package or module beside the config if one is there, else an installed
    one (found without importing it).

    Raises:
        ValueError: the file or package is missing, or is no Python source.
    """
    if spec.is_file:
        path = Path(os.path.abspath(base / Path(spec.module).expanduser()))
        if not path.is_file():
            raise ValueError(f"the file {str(path)!r} does not exist")
        top = _package_top(path)
        if top is None:
            return LocatedSource("file", path, path.stem, spec.function)
        parts = path.relative_to(top.parent).with_suffix("").parts
        if not all(_IDENTIFIER.match(p) for p in parts):
            raise ValueError(
                f"{str(path)!r} is inside package {str(top)!r} but its path "
                f"{'/'.join(parts)} is not a dotted module name"
            )
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        return LocatedSource("package", top, module, spec.function)
    first = spec.module.split(".")[0]
    if (base / first / "__init__.py").is_file():
        return LocatedSource("package", Path(os.path.abspath(base / first)), spec.module, spec.function)
    if "." not in spec.module and (base / f"{first}.py").is_file():
        return LocatedSource("file", Path(os.path.abspath(base / f"{first}.py")), first, spec.function)
    try:
        found = importlib.util.find_spec(first)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise ValueError(f"no module {first!r} beside the config ({str(base)!r}) or installed")
    if found.submodule_search_locations:
        return LocatedSource("installed", Path(list(found.submodule_search_locations)[0]), spec.module, spec.function)
    if found.origin and found.origin.endswith(".py") and "." not in spec.module:
        return LocatedSource("installed", Path(found.origin), first, spec.function)
    raise ValueError(f"{first!r} is not Python source ({found.origin!r})")


def source_files(path: Path) -> dict[str, bytes]:
    """The bytes of a source: ``{relative posix path: bytes}`` below the file's or package's parent.

    A package keeps every regular file below it except bytecode (``__pycache__``, ``*.pyc``)
    and hidden entries; links are read through.

    Raises:
        ValueError: more than 2000 files or 32 MiB, or nothing to read.
    """
    if path.is_file():
        return {path.name: path.read_bytes()}
    files: dict[str, bytes] = {}
    total = 0
    for directory, subdirs, names in os.walk(path):
        subdirs[:] = sorted(d for d in subdirs if d != "__pycache__" and not d.startswith("."))
        for name in sorted(names):
            if name.startswith(".") or name.endswith(".pyc"):
                continue
            file = Path(directory) / name
            if not file.is_file():
                continue
            data = file.read_bytes()
            total += len(data)
            files[f"{path.name}/{file.relative_to(path).as_posix()}"] = data
            if len(files) > _MAX_FILES or total > _MAX_BYTES:
                raise ValueError(
                    f"the source {str(path)!r} holds more than {_MAX_FILES} files or "
                    f"{_MAX_BYTES // 2**20} MiB; allowed: a module or package of code"
                )
    if not files:
        raise ValueError(f"the source {str(path)!r} holds no files")
    return files


@functools.cache
def _installed_roots() -> list[Path]:
    """Where installed code lives: the interpreter's and environment's library directories, and qhlab's own."""
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, str(Path(__file__).resolve().parents[1])}
    roots.update(sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib"))
    return [Path(os.path.abspath(r)) for r in roots]


def is_installed(location: str | os.PathLike) -> bool:
    """Whether a file lies inside the installed library directories (an installed package's, or qhlab's own)."""
    resolved = Path(os.path.abspath(location))
    return any(root == resolved or root in resolved.parents for root in _installed_roots())


def unbound_modules(module: str, loaded: Iterable[str]) -> list[tuple[str, str | None]]:
    """Modules an import of a frozen copy loaded that are neither the copy nor installed code.

    A module named like the user's own top-level module or package, or loaded from outside the
    installed library directories (a sibling file on ``sys.path``, the working directory,
    ``PYTHONPATH``), is code no freeze bound and that could change after it.

    Args:
        module: the copy's dotted module (its top-level name is the user's own).
        loaded: names that appeared in ``sys.modules`` during the import or the entry's call.

    Returns:
        ``[(name, file)]`` of such modules, sorted by name (empty: none).
    """
    top = module.split(".")[0]
    installed = _installed_roots()
    found = []
    for name in sorted(loaded):
        if name.startswith(_MODULE_PREFIX):
            continue
        file = getattr(sys.modules.get(name), "__file__", None)
        path = None if file is None else Path(os.path.abspath(file))
        outside = path is not None and not any(root == path or root in path.parents for root in installed)
        if name == top or name.startswith(top + ".") or outside:
            found.append((name, file))
    return found


def missing_sibling(directory: Path, exc: BaseException) -> str | None:
    """The module beside a single-file source that its import could not find (None: not that case).

    A bare ``import helpers`` in a frozen single file names a module the copy does not hold; when
    ``helpers.py`` (or a ``helpers/`` package) sits beside the user's file, the fix is
    ``UNFROZEN_HINT``, not a missing install.
    """
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        top = exc.name.split(".")[0]
        if (directory / f"{top}.py").is_file() or (directory / top / "__init__.py").is_file():
            return top
    return None


def source_digest(digests: dict[str, str]) -> str:
    """The digest of a source: sha256 of the canonical JSON of ``{relative path: sha256}``."""
    return sha256_bytes(canonical_json(dict(sorted(digests.items()))))


def file_digests(files: dict[str, bytes]) -> dict[str, str]:
    """``{relative path: sha256}`` of ``source_files``' bytes."""
    return {rel: sha256_bytes(data) for rel, data in files.items()}


def read_source(entry: str, base: Path, *, field: str = "builder") -> tuple[LocatedSource, dict[str, bytes]]:
    """Parse an entry string, find its source relative to ``base`` and read it.

    Returns:
        (where the source is, ``source_files`` of it).

    Raises:
        ValueError: a malformed entry, a missing or non-Python source, or one too large.
    """
    located = locate_source(parse_entry(entry, field=field), base)
    return located, source_files(located.path)


@dataclass
class FrozenSource:
    """A copy of user code's source that this process may import.

    Attributes:
        owner: what the code is, for messages (``"arm 'mlp'"``, ``"environment 'my-grid'"``).
        entry: the entry string as the config wrote it.
        root: the directory holding the copy (its files are ``root / <relative path>``).
        module: the dotted module inside the copy.
        function: the entry's name.
        files: ``{relative path: sha256}`` the copy must have, exactly.
        sealed: ``root`` holds exactly ``files`` (a frozen copy: any other file there,
            bytecode and hidden files included, is refused); False for a user's own directory
            (``qhlab fit``), where only the bound files are checked.
        sha256: ``source_digest(files)``.
        preloaded: the copy's bytes, already read and checked (a source shipped in memory, or
            one read from the user's files at generation); None: read ``root`` at first use.
    """

    owner: str
    entry: str
    root: Path
    module: str
    function: str
    files: dict[str, str]
    sealed: bool = True
    sha256: str = ""
    preloaded: dict[str, bytes] | None = field(default=None, repr=False, compare=False)
    _function: Callable[..., Any] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.sha256 = source_digest(self.files)

    def check(self) -> dict[str, bytes]:
        """The copy's bound bytes, refused unless they are exactly the bound ones.

        Returns:
            ``{relative path: bytes}``, read once: the import compiles these very bytes.

        Raises:
            EvidenceError: a bound file changed or is missing, or (``sealed``) a file was added.
        """
        if self.preloaded is not None and file_digests(self.preloaded) == self.files:
            return self.preloaded
        read: dict[str, bytes] = {}
        for rel in self.files:
            path = self.root / rel
            if path.is_file() and not path.is_symlink():
                read[rel] = path.read_bytes()
        present = file_digests(read)
        if self.sealed:
            for directory, subdirs, names in os.walk(self.root):
                for name in [*names, *(d for d in subdirs if (Path(directory) / d).is_symlink())]:
                    present.setdefault((Path(directory) / name).relative_to(self.root).as_posix(), "added")
        changed = differing_keys(self.files, present)
        if changed:
            raise EvidenceError(
                f"{self.owner}: the frozen copy of its source in {self.root} differs from the bound digests "
                f"in {', '.join(changed)}. HINT: frozen source is evidence; restore the copy (or make it again "
                "from its config), never edit it."
            )
        return read

    @property
    def origin_root(self) -> Path:
        """The directory its imported modules name as their files (tracebacks show these paths).

        Copies with one digest share one imported module, so this is the first such copy's root.
        """
        registered = _FINDER.copies.get(self.sha256[:16])
        return self.root if registered is None else registered[0]

    def import_module(self) -> Any:
        """The copy's module, imported from its checked bytes (once per digest in a process).

        For a source with no entry function of its own: a module that registers a Gymnasium task
        when it is imported.
        """
        # The imported bytes are kept: what a population copies is exactly what ran.
        self.preloaded = self.check()
        return _import_copy(self, self.preloaded)

    def entry_function(self) -> Callable[..., Any]:
        """The entry, imported from the checked bytes of the copy on first use."""
        if self._function is None:
            module = self.import_module()
            function = getattr(module, self.function, None)
            if function is None or not callable(function):
                raise QhError(f"{self.owner}: {self.entry!r}: module {self.module!r} has no callable {self.function!r}")
            self._function = function
        return self._function


class _CopyLoader(importlib.abc.Loader):
    """Executes a module from bytes already checked: never a file read later, never bytecode.

    A package's data files (``importlib.resources.files(__package__)``) are served from the same
    checked bytes, so the data a copy reads is the data its freeze bound.
    """

    def __init__(self, source: bytes, origin: str, resources: _CopyResources | None = None) -> None:
        self._source = source
        self._origin = origin
        self._resources = resources

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: Any) -> None:
        exec(compile(self._source, self._origin, "exec", dont_inherit=True), module.__dict__)

    def get_resource_reader(self, fullname: str) -> _CopyResources | None:
        return self._resources


class _CopyResources(importlib.resources.abc.TraversableResources):
    """One package directory of a checked copy, as ``importlib.resources`` reads it: in memory.

    The copy's bytes are held in a zip archive built in memory, whose ``zipfile.Path`` is a
    ``Traversable`` (``joinpath``, ``iterdir``, ``read_bytes``, ``read_text``, ``open``).
    """

    def __init__(self, files: dict[str, bytes], package: str) -> None:
        self._files = files
        self._package = package
        self._archive: zipfile.ZipFile | None = None

    def files(self) -> zipfile.Path:
        if self._archive is None:
            buffer = io.BytesIO()
            with zipfile.ZipFile(buffer, "w") as archive:
                for rel, data in sorted(self._files.items()):
                    archive.writestr(rel, data)
            self._archive = zipfile.ZipFile(buffer)
        return zipfile.Path(self._archive, at=f"{self._package}/")


class _CopyFinder(importlib.abc.MetaPathFinder):
    """Finds the modules of checked copies, by their digest-derived names, in memory only.

    A module named ``_qhlab_user_<digest16>_<top>[.<sub>...]`` is served from the checked bytes
    of the copy with that digest; a name the copy does not hold is not found (a package's
    relative import of an unbound file fails rather than reading the disk).
    """

    def __init__(self) -> None:
        self.copies: dict[str, tuple[Path, dict[str, bytes]]] = {}

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(_MODULE_PREFIX):
            return None
        prefix, _, top_and_rest = fullname[len(_MODULE_PREFIX) :].partition("_")
        copy = self.copies.get(prefix)
        if copy is None or not top_and_rest:
            return None
        root, files = copy
        parts = top_and_rest.split(".")
        for rel, package in (("/".join(parts) + "/__init__.py", True), ("/".join(parts) + ".py", False)):
            if rel in files:
                resources = _CopyResources(files, "/".join(parts)) if package else None
                loader = _CopyLoader(files[rel], str(root / rel), resources)
                spec = importlib.machinery.ModuleSpec(fullname, loader, origin=str(root / rel), is_package=package)
                if package:
                    spec.submodule_search_locations = []
                spec.has_location = True
                return spec
        return None


class UnfrozenImportError(ImportError):
    """Frozen user code imported a module that is neither in its copy nor installed."""

    def refusal(self, call: str, who: str) -> QhInputError:
        """This import as one refusal of the user input it came from.

        An import made after the freeze's checks ran (on a later forward, at evaluation) is
        refused by the guard when it runs; the caller names whose code made it, so that it reads
        as one line rather than a traceback through the trainer.

        Args:
            call: the refusing call.
            who: whose code imported it, e.g. ``"arm 'my_arm' (builder 'x.py:b') in cell 'c'"``.
        """
        return QhInputError(
            f"{call}: {who}: during the fit its code imported module {self.name!r} from {self.path!r}, which is "
            f"not in its frozen source. HINT: {UNFROZEN_HINT}."
        )


class _UnfrozenGuard(importlib.abc.MetaPathFinder):
    """Refuses, in every process, any import made while frozen user code runs that would load code
    no freeze bound: a module resolving outside the installed library directories (a sibling of
    the user's file on ``sys.path``, the working directory, ``PYTHONPATH``, a directory the user
    code put on ``sys.path`` itself).

    "While frozen user code runs" is decided by the whole stack, not the importing frame: an
    ``import`` statement, ``__import__``, ``importlib.import_module`` or ``importlib.reload``
    reached from a module named ``_qhlab_user_...`` (at its import, inside a forward, a step, at
    any depth) is checked, however many library frames stand between. Installed packages importing
    their own modules pass (they resolve inside the library directories). A refused import raises
    ``UnfrozenImportError`` (an ImportError), so code that guards an optional import behaves in a
    cell exactly as it did at the freeze, where the module was not there to import.
    """

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.startswith(_MODULE_PREFIX) or not _user_code_running():
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        origin = None if spec is None else spec.origin
        if origin is None or not os.path.isabs(origin):
            return None  # built in, frozen, namespace, or not found (the next finder says so)
        _refuse_unbound(fullname, origin)
        return None


def _refuse_unbound(name: str, location: str | os.PathLike) -> None:
    """Raise ``UnfrozenImportError`` when ``location`` lies outside the installed library directories."""
    resolved = Path(os.path.abspath(location))
    if is_installed(resolved):
        return
    raise UnfrozenImportError(
        f"frozen user code imported module {name!r} from {str(resolved)!r}, which is not in its frozen "
        f"source. HINT: {UNFROZEN_HINT}.",
        name=name,
        path=str(resolved),
    )


def _user_code_running() -> bool:
    """A module of a frozen copy is on the calling stack (its code runs, at any depth)."""
    frame = sys._getframe(2)
    while frame is not None:
        if str(frame.f_globals.get("__name__", "")).startswith(_MODULE_PREFIX):
            return True
        frame = frame.f_back
    return False


_spec_from_file_location = importlib.util.spec_from_file_location


def _guarded_spec_from_file_location(name: str, location: Any = None, *args: Any, **kwargs: Any) -> Any:
    """``importlib.util.spec_from_file_location``, refused for a file outside the installed library
    directories while frozen user code runs: loading a file by path bypasses every import finder."""
    if location is not None and _user_code_running():
        _refuse_unbound(name, location)
    return _spec_from_file_location(name, location, *args, **kwargs)


_MODULE_PREFIX = "_qhlab_user_"
_FINDER = _CopyFinder()
sys.meta_path.insert(0, _FINDER)
sys.meta_path.insert(0, _UnfrozenGuard())
importlib.util.spec_from_file_location = _guarded_spec_from_file_location


def _import_copy(source: FrozenSource, files: dict[str, bytes]) -> Any:
    """Import ``source.module`` from the checked bytes under a digest-derived name.

    The name is never the user's own module's, so the user's files are never what runs; two
    copies with one digest are the same bytes and share one imported module.
    """
    key = source.sha256[:16]
    _FINDER.copies.setdefault(key, (source.root, files))
    return importlib.import_module(f"{_MODULE_PREFIX}{key}_{source.module}")


def _user_prefixes(roots: Iterable[str | os.PathLike] | None) -> tuple[str, ...]:
    if roots is None:
        roots = [root for root, _ in _FINDER.copies.values()]
    return tuple(os.path.join(str(r), "") for r in roots)


def user_frames(exc: BaseException, roots: Iterable[str | os.PathLike] | None = None) -> list[traceback.FrameSummary]:
    """The frames of ``exc``'s traceback that ran user code, outermost first.

    Args:
        exc: the exception.
        roots: the directories holding the user's files; None: every copy of user code that
            this process imported (``provide``), which is where an arm or environment runs from.
    """
    prefixes = _user_prefixes(roots)
    if not prefixes:
        return []
    return [f for f in traceback.extract_tb(exc.__traceback__, limit=None) if f.filename.startswith(prefixes)]


def user_location(
    exc: BaseException,
    roots: Iterable[str | os.PathLike] | None = None,
    *,
    shown_in: str | os.PathLike | None = None,
) -> str:
    """Where in the user's code ``exc`` was raised: ``" at FILE, line N: TEXT"``, or "" when not there.

    A ``SyntaxError`` names its own position (its file never ran); any other exception names
    the innermost frame of ``user_frames``.

    Args:
        exc: the exception.
        roots: as ``user_frames``.
        shown_in: the user's own directory, whose files the copies were made from: a copy's
            path is shown as the same file there (the one the user edits; a copy may live in a
            directory that is not yet published), its line read from there.
    """
    prefixes = _user_prefixes(roots)
    if isinstance(exc, SyntaxError) and exc.filename:
        filename, lineno, text = exc.filename, exc.lineno, exc.text
    else:
        frames = user_frames(exc, roots)
        if not frames:
            return ""
        filename, lineno, text = frames[-1].filename, frames[-1].lineno, frames[-1].line
    if shown_in is not None:
        matched = next((p for p in prefixes if filename.startswith(p)), None)
        if matched is not None:
            filename = os.path.join(str(shown_in), filename[len(matched) :])
            text = text or linecache.getline(filename, lineno or 0)
    text = (text or "").strip()
    return f" at {filename}, line {lineno}" + (f": {text}" if text else "")


# The copies this process may import: (owner, entry string, source sha256) -> FrozenSource.
_PROVIDED: dict[tuple[str, str, str], FrozenSource] = {}


def provide(source: FrozenSource) -> FrozenSource:
    """Make ``source`` available to ``resolve_entry`` in this process (imported on first use).

    The latest copy provided under a key wins, and its files are checked at its first use: a
    process that authenticates a second study (or a moved copy) checks that study's own copy.
    Modules are named by digest, so two copies with one digest share one imported module.
    """
    _PROVIDED[(source.owner, source.entry, source.sha256)] = source
    return source


def resolve_entry(owner: str, entry: str, sha256: str | None, *, call: str = "resolve_entry") -> FrozenSource:
    """The provided copy of user code's source.

    Args:
        owner: what the code is (``"arm 'mlp'"``), as it was provided.
        entry: the entry string.
        sha256: the source's digest.
        call: what a refusal names.

    Raises:
        QhError: no copy with this owner, entry and digest was provided in this process.
    """
    source = _PROVIDED.get((owner, entry, sha256 or ""))
    if source is None:
        raise QhError(
            f"{call}: {owner} ({entry!r}, source sha256 {sha256}) has no source provided in this process. HINT: a "
            "study imports the copies its freeze and its populations bound, and `qhlab fit` the file its recipe "
            "names; from Python, call qhlab.execution.user_code.provide first."
        )
    return source
