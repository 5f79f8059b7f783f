"""Results must match the code that made them: fail on any ``bench/results/*.json`` whose code
has changed since it was written, unless ``bench/stale_ok.json`` names the change and says why
it cannot move a figure.

A results file records the code it ran (``code``: {repo path: sha256 prefix} of its script,
every module the script can reach and its input files; ``results_io.write_results`` and
``headline.py`` write it, per task for the headline). A file written before that record existed
is checked against the code of the commit that last wrote it (its script and what it reached
there), as git holds it. A recorded file that differs from the file as it stands, or is gone,
is a change; so is a module the script reaches now that the record does not hold (code moved
out of a module it ran into a new one, or a new import).

A campaign's summary (``schedule.json``, ``headline.json``, ``split_screen.json``: figures from
cells that each ran as its own process at one commit, ``bench/cells.py``) records the commit,
each cell file's hash and the bench/ code that summarized them: it is stale when a cell file
changed or went, a cell ran at another commit, the commit left HEAD's history, or that bench/
code changed. evoagent/ changing after the commit is not staleness: the summary names the
commit and says what changed since (``evoagent_changed_since``).

``bench/stale_ok.json`` maps a results file (``headline.json#sums`` for one task of the
headline) to ``{"files": {path: sha256 prefix as it stands now}, "why": "..."}``: each changed
file must be listed with its current hash, so an entry covers exactly the change it explains
and a later edit of the same file is flagged again.

    python bench/stale.py            # exit 1 and one line per stale result; exit 0 when none
    python bench/stale.py --ok FILE  # print a stale_ok entry to fill in for FILE's changes
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import networkx as nx
from cells import campaign_problems
from code_graph import (  # bench/ is sys.path[0] when a script runs
    ROOT,
    Tree,
    digest,
    import_graph,
    manifest,
    reached,
)

RESULTS = ROOT / "bench" / "results"
OK_FILE = ROOT / "bench" / "stale_ok.json"
PARTS = ("tasks",)  # results whose parts (tasks) were written by separate runs, each with its code


def script_of(result: Path) -> Path | None:
    """The bench script that writes ``result``: ``NAME.json`` from ``NAME.py``, or from the
    longest script name it begins with (``seed_scores_sums.json``); None if none does."""
    scripts = {p.stem: p for p in (ROOT / "bench").glob("*.py")}
    matches = [s for s in scripts if result.stem == s or result.stem.startswith(s + "_")]
    return scripts[max(matches, key=len)] if matches else None


def records(result: Path, data: dict[str, Any]) -> dict[str, dict[str, str]]:
    """{label: code record} of a results file (``data``, as parsed): its own, or each part's, or
    one rebuilt from the commit that last wrote it."""
    if "code" in data:
        return {result.name: data["code"]}
    parts = {f"{result.name}#{name}": part.get("code", {}) for key in PARTS
             for name, part in data.get(key, {}).items() if isinstance(part, dict)}
    if any(parts.values()):  # a part without a record has nothing that says what made it
        return parts
    commit = subprocess.run(
        ["git", "log", "-1", "--format=%H", "--", str(result.relative_to(ROOT))],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    script = script_of(result)
    if not commit or script is None:
        return {result.name: {}}  # no record, and nothing else says what made it
    return {result.name: manifest(script, tree=Tree(commit))}


def changes(code: dict[str, str]) -> dict[str, str | None]:
    """{path: its hash now (None: gone)} of every recorded file that is not as recorded."""
    out: dict[str, str | None] = {}
    for path, recorded in code.items():
        f = ROOT / path  # a full path (an input outside the repository) stays as it is
        now = digest(f.read_bytes()) if f.is_file() else None
        if now != recorded:
            out[path] = now
    return out


def newly_reached(
    result: Path, data: dict[str, Any], code: dict[str, str], graph: nx.DiGraph
) -> dict[str, str]:
    """{path: its hash} of the modules ``result``'s script reaches now that ``code`` does not
    record (a campaign's summary records only bench/, so only bench/ counts for it)."""
    script = script_of(result)
    if script is None:
        return {}
    now = {graph.nodes[m]["path"] for m in reached(graph, script.stem)}
    if "campaign" in data:
        now = {p for p in now if p.startswith("bench/")}
    return {p: digest((ROOT / p).read_bytes()) for p in sorted(now - set(code))}


def check() -> list[str]:
    """One line per stale result (empty: all match their code, or their changes are excused)."""
    ok: dict[str, Any] = json.loads(OK_FILE.read_text()) if OK_FILE.is_file() else {}
    problems, labels = [], set()
    graph = import_graph()
    for result in sorted(RESULTS.glob("*.json")):
        data = json.loads(result.read_text())
        if "campaign" in data:
            problems += [f"{result.name}: {p} (run the campaign's missing cells and summarize again)"
                         for p in campaign_problems(result, data["campaign"])]
        for label, code in records(result, data).items():
            labels.add(label)
            if not code:
                problems.append(f"{label}: no record of the code that made it")
                continue
            changed = changes(code) | newly_reached(result, data, code, graph)
            excused = ok.get(label, {}).get("files", {})
            left = {p: h for p, h in changed.items() if excused.get(p, "missing") != h}
            if left:
                problems.append(
                    f"{label}: its code changed since it was written: {', '.join(sorted(left))} "
                    "(re-run it, or explain the change in bench/stale_ok.json)"
                )
    problems += [f"bench/stale_ok.json: {label} names no results file" for label in sorted(set(ok) - labels)]
    return problems


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--ok", metavar="FILE", help="print a stale_ok entry for FILE's changes (e.g. rl_gain.json)"
    )
    a = ap.parse_args()
    if a.ok:
        wanted = Path(a.ok).name  # bench/results/rl_gain.json or rl_gain.json
        result, graph = RESULTS / wanted.split("#")[0], import_graph()
        data = json.loads(result.read_text())
        entries = {
            lab: {"files": changes(code) | newly_reached(result, data, code, graph), "why": "TODO"}
            for lab, code in records(result, data).items()
            if lab == wanted or "#" not in wanted
        }
        print(json.dumps(entries, indent=2))
        return
    problems = check()
    for p in problems:
        print(f"stale: {p}")
    if problems:
        sys.exit(1)
    print(
        f"stale: every result in {RESULTS.relative_to(ROOT)} matches the code that made it "
        f"(or its change is explained in {OK_FILE.name}); ratio of stale results 0.0"
    )


if __name__ == "__main__":
    main()
