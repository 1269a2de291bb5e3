"""Which installed package an allocation site belongs to (memreclaim.diagnosis._attribute)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from memreclaim.diagnosis import _attribute
from memreclaim.diagnosis.report import AllocationSite, _owned


def _load(tmp_path: Path, name: str, source: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return path


def test_a_c_function_called_on_the_line_names_its_distribution(tmp_path: Path) -> None:
    numpy = pytest.importorskip("numpy")
    path = _load(
        tmp_path,
        "attr_user_code",
        "import numpy\nimport json\nKEEP = []\n"
        "def work():\n    KEEP.append(numpy.zeros(10))\n"
        "def mine():\n    KEEP.append(json.dumps([1]))\n",
    )
    try:
        found = _attribute.owner(str(path), 5)
        assert found is not None
        assert found.name == "numpy" and found.version == numpy.__version__
        assert found.extension is not None and found.extension.endswith(".so")
        site = _owned(AllocationSite(str(path), 5, 4096, 1))
        assert site.owner == str(found) and f"[inside numpy {numpy.__version__}" in str(site)
        # The standard library and the user's own code are nobody's package.
        assert _attribute.owner(str(path), 7) is None
        assert _attribute.owner(json.__file__, 1) is None
    finally:
        sys.modules.pop("attr_user_code", None)


def test_a_file_inside_a_distribution_names_it() -> None:
    pytest_file = Path(pytest.__file__)
    found = _attribute.owner(str(pytest_file), 1)
    if "site-packages" not in str(pytest_file.resolve()):
        pytest.skip("pytest is not installed under site-packages here")
    assert found is not None and found.name == "pytest" and found.extension is None


def test_unknown_files_and_lines_are_nobodys(tmp_path: Path) -> None:
    assert _attribute.owner(str(tmp_path / "missing.py"), 3) is None
    assert _attribute.owner("<string>", 1) is None
    assert _attribute._callee_names("not python (") == []
