"""Which source files a script can run: its imports, read with ``ast`` (lazy ones and those of
its child processes included, since children run the same file), followed through evoagent's
modules and bench/'s helpers. ``bench/stale.py`` checks each results file against the hashes
of these files; ``tests/test_imports.py`` checks evoagent's import graph for circles."""

from __future__ import annotations

import ast
import hashlib
import subprocess
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "evoagent"


class Tree:
    """The repository's files: as they stand, as git holds them at ``commit``, or as they were
    when ``snapshot`` was taken (a benchmark takes one as it starts, so the code it records is
    the code it ran, whatever is edited while it runs)."""

    def __init__(self, commit: str | None = None, frozen: dict[str, bytes] | None = None) -> None:
        self.commit = commit
        self.frozen = frozen

    def snapshot(self, folders: tuple[str, ...]) -> Tree:
        """These folders' files, read now and kept."""
        return Tree(frozen={p: self.read(p) for f in folders for p in self.files(f, "**/*")})

    def files(self, folder: str, pattern: str) -> list[str]:
        """Repository paths under ``folder`` matching ``pattern`` (``**/*.py``: recursive)."""
        if self.frozen is not None:
            paths = [p for p in self.frozen if p.startswith(folder.rstrip("/") + "/")]
        elif self.commit is not None:
            paths = subprocess.run(
                ["git", "ls-tree", "-r", "--name-only", self.commit, "--", folder],
                cwd=ROOT, capture_output=True, text=True, check=True,
            ).stdout.split()
        else:
            paths = [str(f.relative_to(ROOT)) for f in (ROOT / folder).rglob("*") if f.is_file()]
        deep = pattern.startswith("**/")
        return sorted(
            p for p in paths
            if "__pycache__" not in p and Path(p).match(pattern.removeprefix("**/"))
            and (deep or Path(p).parent == Path(folder))
        )

    def read(self, path: str) -> bytes:
        if self.frozen is not None:
            return self.frozen[path]
        if self.commit is None:
            return (ROOT / path).read_bytes()
        return subprocess.run(
            ["git", "show", f"{self.commit}:{path}"], cwd=ROOT, capture_output=True, check=True
        ).stdout


def modules(tree: Tree) -> dict[str, str]:
    """{dotted name: repo path} of every module of the package, and of bench/'s scripts
    under their bare names."""
    out = {}
    for f in tree.files(PACKAGE, "**/*.py"):
        parts = list(Path(f).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = f
    for f in tree.files("bench", "*.py"):
        out[Path(f).stem] = f
    return out


def imported(source: bytes, path: str, name: str, known: dict[str, str]) -> set[str]:
    """The known modules the file at ``path`` (module ``name``) imports, anywhere in its body."""
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            if base in known:  # the package or module itself runs, whatever is taken from it
                found.add(base)
            targets = [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:  # a name imported from a module: the module
                t = t.rpartition(".")[0]
            if t:
                found.add(t)
    found.discard(name)
    return found


def import_graph(tree: Tree | None = None) -> nx.DiGraph:
    """Module -> the modules it imports, over evoagent and bench/ (``path``: each one's file)."""
    tree = tree or Tree()
    known = modules(tree)
    g = nx.DiGraph()
    for name, path in known.items():
        g.add_node(name, path=path)
        g.add_edges_from((name, t) for t in imported(tree.read(path), path, name, known))
    return g


def reached(g: nx.DiGraph, start: str) -> set[str]:
    """Every module that runs when ``start`` runs: what it imports, transitively, and the
    packages those live in (Python runs a package's ``__init__`` before any module of it)."""
    todo, seen = [start], set()
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        parents = [m.rsplit(".", k)[0] for k in range(1, m.count(".") + 1)]
        todo += [p for p in parents if p in g] + list(g.successors(m))
    return seen


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def manifest(
    script: Path, inputs: tuple[Path, ...] = (), tree: Tree | None = None
) -> dict[str, str]:
    """{repo path: sha256 prefix} of ``script``, every module it can reach, and ``inputs``
    (files, or folders taken whole: task folders, seed graphs), in ``tree`` (default: as the
    files stand)."""
    tree = tree or Tree()
    g = import_graph(tree)
    files = {g.nodes[m]["path"] for m in reached(g, script.stem)}
    outside = {}  # inputs outside the repository (a user's task): as they stand, by full path
    for p in (p.resolve() for p in inputs):
        if not p.is_relative_to(ROOT):
            here = [f for f in p.rglob("*") if f.is_file()] if p.is_dir() else [p]
            here = [f for f in here if "__pycache__" not in f.parts]
            outside |= {str(f): digest(f.read_bytes()) for f in here}
            continue
        rel = str(p.relative_to(ROOT))
        found = tree.files(rel, "**/*") if p.is_dir() else [rel]
        files |= {f for f in found if "__pycache__" not in f}
    return {f: digest(tree.read(f)) for f in sorted(files)} | dict(sorted(outside.items()))
