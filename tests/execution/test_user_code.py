"""Frozen user code runs from its copy only: an import it makes of anything unbound is refused.

The case a freeze cannot see: a user file guards an optional import of a module beside it
(``try: from tweak import scale / except ImportError``). At the freeze the module is not
importable, so the arm freezes without it; a later process that has the user's directory on
``sys.path`` (``PYTHONPATH``) must not import it either, or code no freeze bound would run.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from qhlab.execution.user_code import file_digests, read_source

ARM = textwrap.dedent(
    """
    try:
        from tweak import SCALE
    except ImportError:
        SCALE = 1.0


    def build(arch, dims):
        return SCALE
    """
)
TWEAK = "import pathlib, os\npathlib.Path(os.environ['TWEAK_MARK']).write_text('ran')\nSCALE = 0.0\n"

PROGRAM = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from qhlab.execution.user_code import FrozenSource, provide
    copy, module, files = Path(sys.argv[1]), sys.argv[2], eval(sys.argv[3])
    source = provide(FrozenSource(owner="arm 'x'", entry="arms.py:build", root=copy, module=module,
                                  function="build", files=files))
    print(source.entry_function()(None, None))
    """
)


def _frozen_copy(tmp_path):
    user = tmp_path / "user"
    user.mkdir()
    (user / "arms.py").write_text(ARM)
    (user / "tweak.py").write_text(TWEAK)
    located, files = read_source("arms.py:build", user)
    copy = tmp_path / "copy"
    copy.mkdir()
    for rel, data in files.items():
        (copy / rel).write_bytes(data)
    return user, copy, located.module, file_digests(files)


def _run(tmp_path, copy, module, digests, pythonpath):
    env = {"PYTHONPATH": pythonpath, "TWEAK_MARK": str(tmp_path / "mark"), "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-c", PROGRAM, str(copy), module, repr(digests)], capture_output=True, text=True, env=env
    )


def test_a_guarded_import_of_an_unbound_sibling_never_runs_it(tmp_path) -> None:
    user, copy, module, digests = _frozen_copy(tmp_path)
    done = _run(tmp_path, copy, module, digests, str(user))
    assert done.returncode == 0, done.stderr
    # The copy ran as it did at the freeze: without the sibling, which never executed.
    assert done.stdout.strip() == "1.0"
    assert not (tmp_path / "mark").exists()


def test_the_guard_is_what_stops_it(tmp_path) -> None:
    # The same user directory on sys.path, imported by ordinary code: the sibling does run, so
    # the test above fails if the guard does not hold.
    user, *_ = _frozen_copy(tmp_path)
    env = {"PYTHONPATH": str(user), "TWEAK_MARK": str(tmp_path / "mark"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", "import arms; print(arms.SCALE)"], capture_output=True, text=True, env=env
    )
    assert done.stdout.strip() == "0.0" and (tmp_path / "mark").read_text() == "ran"


def test_an_unguarded_import_is_refused_by_name(tmp_path) -> None:
    user, copy, module, digests = _frozen_copy(tmp_path)
    (copy / "arms.py").write_text("from tweak import SCALE\n\n\ndef build(arch, dims):\n    return SCALE\n")
    digests = file_digests({"arms.py": (copy / "arms.py").read_bytes()})
    done = _run(tmp_path, copy, module, digests, str(user))
    assert done.returncode != 0
    assert "UnfrozenImportError: frozen user code imported module 'tweak'" in done.stderr, done.stderr
    assert "not in its frozen source" in done.stderr and not (tmp_path / "mark").exists()


def test_installed_packages_and_the_standard_library_import_as_usual(tmp_path) -> None:
    user, copy, module, _ = _frozen_copy(tmp_path)
    (copy / "arms.py").write_text(
        "import json, numpy\n\n\ndef build(arch, dims):\n    return numpy.float64(json.loads('2.5'))\n"
    )
    digests = file_digests({"arms.py": (copy / "arms.py").read_bytes()})
    done = _run(tmp_path, copy, module, digests, str(user))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "2.5"


# However the unbound code is loaded, and however late: each variant returns 1.0 when the guard
# refused the load (an ImportError its code catches) and 0.0 when the sibling ran.
_LATE_LOADS = {
    "import_module at call time": "importlib.import_module('tweak')",
    "__import__ at call time": "__import__('tweak')",
    "a directory put on sys.path by the code": "sys.path.insert(0, DIRECTORY) or importlib.import_module('tweak')",
    "spec_from_file_location": (
        "importlib.util.module_from_spec(importlib.util.spec_from_file_location('tweak', DIRECTORY + '/tweak.py'))"
    ),
}


def _late_arm(load: str, directory: str) -> str:
    return textwrap.dedent(
        f"""
        import importlib, importlib.util, sys
        DIRECTORY = {directory!r}


        def build(arch, dims):
            try:
                module = {load}
                if not hasattr(module, "SCALE"):
                    module.__spec__.loader.exec_module(module)
                return module.SCALE
            except ImportError:
                return 1.0
        """
    )


@pytest.mark.parametrize("what", sorted(_LATE_LOADS))
def test_code_no_freeze_bound_never_runs_however_it_is_loaded(tmp_path, what) -> None:
    user, copy, module, _ = _frozen_copy(tmp_path)
    # The call happens long after the copy's import: inside the entry function, as a forward or a step.
    (copy / "arms.py").write_text(_late_arm(_LATE_LOADS[what], str(user)))
    digests = file_digests({"arms.py": (copy / "arms.py").read_bytes()})
    done = _run(tmp_path, copy, module, digests, str(user))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1.0" and not (tmp_path / "mark").exists(), (what, done.stdout, done.stderr)


PACKAGE_ARM = textwrap.dedent(
    """
    import importlib.resources
    import json


    def build(arch, dims):
        root = importlib.resources.files(__package__)
        shapes = sorted(p.name for p in (root / "shapes").iterdir())
        return json.loads((root / "widths.json").read_text(encoding="utf-8")), shapes
    """
)


def test_package_data_is_read_from_the_checked_copy_through_importlib_resources(tmp_path) -> None:
    from qhlab.execution.user_code import FrozenSource, provide

    package = tmp_path / "user" / "myarms"
    (package / "shapes").mkdir(parents=True)
    (package / "__init__.py").write_text(PACKAGE_ARM)
    (package / "widths.json").write_text('{"hidden": 48}')
    (package / "shapes" / "wide.json").write_text("{}")
    located, files = read_source("myarms/__init__.py:build", tmp_path / "user")
    assert located.kind == "package" and "myarms/widths.json" in files
    copy = tmp_path / "copy"
    for rel, data in files.items():
        (copy / rel).parent.mkdir(parents=True, exist_ok=True)
        (copy / rel).write_bytes(data)
    source = provide(
        FrozenSource(
            owner="arm 'resources'",
            entry="myarms/__init__.py:build",
            root=copy,
            module=located.module,
            function="build",
            files=file_digests(files),
        )
    )
    build = source.entry_function()
    # The copy's files changed after its check: what the arm reads is still the bytes checked.
    (copy / "myarms" / "widths.json").write_text('{"hidden": 4096}')
    assert build(None, None) == ({"hidden": 48}, ["wide.json"])
