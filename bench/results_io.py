"""Where every benchmark script writes its figures: ``bench/results/NAME.json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def write_results(name: str, figures: Any) -> Path:
    """Write ``figures`` as indented JSON to ``bench/results/NAME.json``, say so, return the path."""
    dest = RESULTS / f"{name}.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"wrote {dest}")
    return dest
