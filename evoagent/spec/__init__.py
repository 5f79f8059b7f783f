"""task.yaml: the pydantic schema (``config``), the YAML reader (``load``) and ``load_spec``.

``load_spec`` validates the file's schema; ``evoagent.check.check_spec`` then checks every
*name* the spec uses against the registries of the floors above (graphs, tools, operators,
rewards, datasets, backends), so a typo fails in a second, naming the field, before any model
loads.
"""

from __future__ import annotations

from pathlib import Path

from evoagent.errors import SpecError
from evoagent.spec.config import BackendConfig, RunSpec
from evoagent.spec.load import read_yaml, validate


def load_spec(path: Path | str) -> RunSpec:
    """Read and validate a task.yaml; relative paths in it resolve against its folder."""
    path = Path(path)
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise SpecError(f"{path}: the top level must be a mapping of fields")
    data.setdefault("base_dir", str(path.resolve().parent))
    return validate(RunSpec, data, str(path))


__all__ = ["BackendConfig", "RunSpec", "load_spec"]
